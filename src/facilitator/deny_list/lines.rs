//! The list of one key a line: a 0x address for the EVM family or a base58 key for Solana;
//! blank lines and `#` comments are skipped, and any other line stops the read, named by its
//! number.

use std::io::BufRead;
use std::str::FromStr;

use super::{Format, Loaded};
use crate::evm;
use crate::svm::Pubkey;

#[derive(Debug)]
pub enum Error {
    Io(std::io::Error),
    /// The line of that number (from 1) is neither kind.
    Entry(usize),
}

pub fn read(reader: impl BufRead) -> Result<Loaded, Error> {
    let mut loaded = Loaded::new(Format::Lines);
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(Error::Io)?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with("0x") {
            let address = evm::parse_address(line).ok_or(Error::Entry(i + 1))?;
            loaded.list.evm.insert(address);
        } else {
            let key = Pubkey::from_str(line).map_err(|_| Error::Entry(i + 1))?;
            loaded.list.svm.insert(key);
        }
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    const KEY: &str = "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU";

    #[test]
    fn both_families_are_read_and_comments_skipped() {
        let text = format!(
            "# payers\n\n  0x00000000000000000000000000000000000000aB  \n{KEY}\n# {KEY}x\n"
        );
        let list = read(text.as_bytes()).unwrap().list;
        assert_eq!(list.evm.len(), 1);
        assert_eq!(list.svm, HashSet::from([Pubkey::from_str(KEY).unwrap()]));
    }

    #[test]
    fn a_malformed_line_is_named_by_its_number() {
        for bad in [
            "0x12",
            "0xZZ00000000000000000000000000000000000000",
            "not-base58!",
            "1111",
        ] {
            let text = format!("# ok\n{KEY}\n{bad}\n");
            assert!(
                matches!(read(text.as_bytes()), Err(Error::Entry(3))),
                "{bad}"
            );
        }
    }
}
