//! The Treasury's SDN CSV (`sdn.csv`): one record per party, no header, its ent_num first and its
//! remarks last (the twelfth field), where each digital currency address is a clause such as
//! `Digital Currency Address - ETH 0x098B...; alt. Digital Currency Address - ETH 0xa0e1...;`.
//! Remarks longer than the field's 1,000 characters go on in `sdn_comments.csv` (ent_num, then
//! the rest): a party's last fields are joined in file order before they are searched, so the two
//! files concatenated (`cat sdn.csv sdn_comments.csv`) give every address, even one cut by the
//! limit. Each file's last line, a lone end-of-file byte, is a record like any other.

use std::collections::HashMap;
use std::io::BufRead;

use super::{classify, DenyListError, Format, Loaded};

const CLAUSE: &str = "Digital Currency Address - ";
/// The DOS end-of-file byte the Treasury ends each file with.
const END_OF_FILE: char = '\x1a';

pub fn read(reader: impl BufRead) -> Result<Loaded, DenyListError> {
    let mut csv = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(reader);
    // The remarks by ent_num, with their continuations.
    let mut remarks: HashMap<String, String> = HashMap::new();
    for record in csv.byte_records() {
        let record = record.map_err(|e| DenyListError::Csv {
            line: e.position().map_or(0, |p| p.line()),
            reason: e.to_string(),
        })?;
        let (Some(id), Some(text)) = (record.get(0), record.iter().next_back()) else {
            continue;
        };
        let id = String::from_utf8_lossy(id);
        let id = id.trim_matches(|c: char| c == END_OF_FILE || c.is_whitespace());
        let text = String::from_utf8_lossy(text);
        remarks.entry(id.to_string()).or_default().push_str(&text);
    }
    let mut loaded = Loaded::new(Format::SdnCsv);
    for text in remarks.values() {
        for (ticker, address) in clauses(text) {
            loaded.take(classify(ticker, address));
        }
    }
    Ok(loaded)
}

/// The ticker and address of each clause: the two words after its name, the address without
/// the `;` or `.` that ends the clause.
fn clauses(remarks: &str) -> impl Iterator<Item = (&str, &str)> {
    remarks.split(CLAUSE).skip(1).map(|clause| {
        let mut words = clause.split_whitespace();
        let ticker = words.next().unwrap_or_default().trim_end_matches(':');
        let address = words.next().unwrap_or_default();
        (ticker, address.trim_end_matches([';', '.', ',']))
    })
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;
    use crate::evm;
    use crate::svm::Pubkey;

    const SAMPLE: &[u8] = include_bytes!("../../../tests/fixtures/sdn/sdn_sample.csv");

    #[test]
    fn the_sample_gives_its_evm_and_solana_addresses() {
        let loaded = read(SAMPLE).unwrap();
        assert_eq!(loaded.format, Some(Format::SdnCsv));
        let evm = [
            "0x8576aCC5C05D6Ce88f4e49bf65BdF0C62F91353C",
            "0x1da5821544e25c636c1417Ba96Ade4Cf6D2f9B5A",
            "0x7Db418b5D567A4e0E8c59Ad71BE1FcE48f3E6107",
        ];
        let evm = evm.map(|a| evm::parse_address(a).unwrap());
        assert_eq!(loaded.list.evm, evm.into());
        let sol = Pubkey::from_str("3CBwgSdKhe9ixNTxNLGNeGRb4hWQTi1fs3aYKzUNLRbi").unwrap();
        assert_eq!(loaded.list.svm, [sol].into());
        assert_eq!((loaded.other_chains, loaded.malformed), (1, 1));
    }

    #[test]
    fn remarks_cut_at_the_limit_go_on_in_the_comments_file() {
        let text = String::from_utf8_lossy(SAMPLE).into_owned();
        let address = "0x1da5821544e25c636c1417Ba96Ade4Cf6D2f9B5A";
        let cut = text.find(address).unwrap() + 20;
        let rest = text[cut..].split('"').next().unwrap();
        // sdn.csv with the Lazarus Group's remarks cut inside an address, then sdn_comments.csv.
        let sdn = format!("{}{}", &text[..cut], &text[cut + rest.len()..]);
        let both = format!("{sdn}30618,\"{rest}\"\r\n\x1a");
        let alone = read(sdn.as_bytes()).unwrap();
        assert!(!alone
            .list
            .evm
            .contains(&evm::parse_address(address).unwrap()));
        let joined = read(both.as_bytes()).unwrap();
        assert_eq!(joined.list, read(SAMPLE).unwrap().list);
    }

    #[test]
    fn a_clause_ends_at_its_semicolon_or_the_remarks_end() {
        let remarks = "a.k.a. 'X'; Digital Currency Address - ETH 0xab; alt. \
                       Digital Currency Address - XBT 1abc; Digital Currency Address - SOL key.";
        let found: Vec<_> = clauses(remarks).collect();
        assert_eq!(found, [("ETH", "0xab"), ("XBT", "1abc"), ("SOL", "key")]);
        assert_eq!(clauses("Digital Currency Address - ").count(), 1);
    }

    #[test]
    fn a_csv_without_a_digital_currency_address_is_not_the_list() {
        // add.csv, the parties' postal addresses, is one the operator could fetch instead.
        let add = b"36,25,\"Galeria del Mercado, Local 19\",\"Havana\",\"Cuba\",-0- \r\n";
        assert!(matches!(
            read(&add[..]).unwrap().found_some(),
            Err(DenyListError::NoDigitalCurrency(Format::SdnCsv))
        ));
    }
}
