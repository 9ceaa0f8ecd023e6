//! The KYT deny list (`facilitator.deny_list_file`): one key a line, a 0x address for the EVM
//! family or a base58 key for Solana; blank lines and `#` comments are skipped. Each family's
//! verify refuses its own kind (`access.md` 3c: the list holds for every family).

use std::collections::HashSet;
use std::str::FromStr;

use ethers_core::types::Address;

use super::SetupError;
use crate::evm;
use crate::svm::Pubkey;

/// The list, split by family.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DenyList {
    pub evm: HashSet<Address>,
    pub svm: HashSet<Pubkey>,
}

/// Reads `path` (none when empty); a line that is neither kind names its number.
pub fn load(path: &str) -> Result<DenyList, SetupError> {
    if path.is_empty() {
        return Ok(DenyList::default());
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| SetupError::DenyList(path.to_string(), e.to_string()))?;
    parse(&text)
}

fn parse(text: &str) -> Result<DenyList, SetupError> {
    let mut list = DenyList::default();
    let lines = text.lines().map(str::trim).enumerate();
    for (i, line) in lines.filter(|(_, l)| !l.is_empty() && !l.starts_with('#')) {
        if line.starts_with("0x") {
            let address = evm::parse_address(line).ok_or(SetupError::DenyListEntry(i + 1))?;
            list.evm.insert(address);
        } else {
            let key = Pubkey::from_str(line).map_err(|_| SetupError::DenyListEntry(i + 1))?;
            list.svm.insert(key);
        }
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU";

    #[test]
    fn both_families_are_read_and_comments_skipped() {
        let text = format!(
            "# payers\n\n  0x00000000000000000000000000000000000000aB  \n{KEY}\n# {KEY}x\n"
        );
        let list = parse(&text).unwrap();
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
                matches!(parse(&text), Err(SetupError::DenyListEntry(3))),
                "{bad}"
            );
        }
    }
}
