//! The KYT deny list (`facilitator.deny_list_file`), in one of three shapes told apart by
//! content, not by name: one key a line (a 0x address or a base58 Solana key), the Treasury's
//! SDN advanced XML (`sdn_advanced.xml`), or its SDN CSV (`sdn.csv`, whose remarks carry the
//! digital currency addresses, followed or not by `sdn_comments.csv`, their overflow). From the
//! SDN files routerd takes the addresses of the families it serves and leaves the others. Each
//! family's verify refuses its own kind (`access.md` 3c: the list holds for every family), from
//! the list in force: SIGHUP reads the file again, and a file that does not parse keeps it.

mod lines;
mod sdn_csv;
mod sdn_xml;

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::str::FromStr;
use std::sync::{Arc, PoisonError, RwLock};

use ethers_core::types::Address;

use crate::evm;
use crate::svm::Pubkey;

/// Why a deny list file was not taken. Names the file's place, never its content beyond it.
#[derive(Debug, thiserror::Error)]
pub enum DenyListError {
    #[error("cannot read {0}: {1}")]
    Read(String, String),
    #[error("line {0} is neither a 0x address nor a base58 Solana key")]
    Entry(usize),
    #[error("the XML does not parse at byte {position}: {reason}")]
    Xml { position: u64, reason: String },
    #[error("an XML document whose root is <{0}>, not the SDN advanced XML's <Sanctions>")]
    NotSdnXml(String),
    #[error("the SDN advanced XML ends before </Sanctions>: a partial download?")]
    Truncated,
    #[error("the SDN advanced XML has another element after </Sanctions>")]
    AfterRoot,
    #[error("the CSV does not parse at line {line}: {reason}")]
    Csv { line: u64, reason: String },
    #[error("the {0} names no digital currency address: not the SDN list?")]
    NoDigitalCurrency(Format),
}

/// The shape a deny list file was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One key a line, `#` comments.
    Lines,
    /// The Treasury's `sdn_advanced.xml`.
    SdnAdvancedXml,
    /// The Treasury's `sdn.csv` (and `sdn_comments.csv` after it).
    SdnCsv,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Lines => "list of one key a line",
            Format::SdnAdvancedXml => "SDN advanced XML",
            Format::SdnCsv => "SDN CSV",
        })
    }
}

/// The list, split by family.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DenyList {
    pub evm: HashSet<Address>,
    pub svm: HashSet<Pubkey>,
}

/// What one SDN digital currency address is to routerd.
#[derive(Debug, PartialEq, Eq)]
enum Listed {
    Evm(Address),
    Svm(Pubkey),
    /// Another chain's address (XBT, XMR, TRX...): not a payer routerd can meet.
    OtherChain,
    /// Written as one of routerd's families but not a well-formed address of it.
    Malformed,
}

/// The SDN tickers whose base58 addresses are Solana keys: SOL, and the stablecoins that also
/// live on Solana (their TRON addresses, also base58, are not 32 bytes and stay out).
const SOLANA_TICKERS: [&str; 3] = ["SOL", "USDC", "USDT"];

/// The text after `Digital Currency Address - ` names the ticker; a 0x address is an EVM key
/// whatever chain it was listed for (the same key holds funds on every EVM chain).
fn classify(ticker: &str, address: &str) -> Listed {
    if let Some(hex) = address.strip_prefix("0x").or(address.strip_prefix("0X")) {
        let address = evm::parse_address(&format!("0x{hex}"));
        return address.map_or(Listed::Malformed, Listed::Evm);
    }
    match Pubkey::from_str(address) {
        Ok(key) if SOLANA_TICKERS.contains(&ticker) => Listed::Svm(key),
        Err(_) if ticker == "SOL" => Listed::Malformed,
        _ => Listed::OtherChain,
    }
}

/// A list as read, with what was left out of it.
#[derive(Debug, Default)]
pub struct Loaded {
    pub list: DenyList,
    pub format: Option<Format>,
    /// SDN digital currency addresses of other chains.
    pub other_chains: usize,
    /// SDN addresses written as routerd's families that do not parse.
    pub malformed: usize,
}

impl Loaded {
    pub fn summary(&self) -> Summary {
        Summary {
            format: self.format,
            evm: self.list.evm.len(),
            svm: self.list.svm.len(),
            other_chains: self.other_chains,
            malformed: self.malformed,
        }
    }

    fn new(format: Format) -> Self {
        Self {
            format: Some(format),
            ..Self::default()
        }
    }

    fn take(&mut self, listed: Listed) {
        match listed {
            Listed::Evm(address) => _ = self.list.evm.insert(address),
            Listed::Svm(key) => _ = self.list.svm.insert(key),
            Listed::OtherChain => self.other_chains += 1,
            Listed::Malformed => self.malformed += 1,
        }
    }

    /// The SDN files always list some digital currency address: one that lists none is not
    /// the file the operator meant to install.
    fn found_some(self) -> Result<Self, DenyListError> {
        let none = self.list.evm.is_empty() && self.list.svm.is_empty();
        match self.format {
            Some(format) if none && self.other_chains + self.malformed == 0 => {
                Err(DenyListError::NoDigitalCurrency(format))
            }
            _ => Ok(self),
        }
    }
}

/// What a read took and what it left out, for check-config and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub format: Option<Format>,
    pub evm: usize,
    pub svm: usize,
    pub other_chains: usize,
    pub malformed: usize,
}

/// "3 EVM addresses and 2 Solana keys from the SDN advanced XML (...)".
impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (evm, svm) = (self.evm, self.svm);
        write!(
            f,
            "{evm} EVM {} and {svm} Solana {}",
            addresses(evm),
            keys(svm)
        )?;
        let Some(format) = self.format else {
            return f.write_str(" (no file)");
        };
        write!(f, " from the {format}")?;
        if format != Format::Lines {
            let other = self.other_chains;
            let malformed = self.malformed;
            write!(
                f,
                " ({other} {} of other chains left out, ",
                addresses(other)
            )?;
            write!(f, "{malformed} not well-formed skipped)")?;
        }
        Ok(())
    }
}

fn addresses(count: usize) -> &'static str {
    if count == 1 {
        "address"
    } else {
        "addresses"
    }
}

fn keys(count: usize) -> &'static str {
    if count == 1 {
        "key"
    } else {
        "keys"
    }
}

/// Reads `path` (nothing when empty), in the shape its first bytes show.
pub fn load(path: &str) -> Result<Loaded, DenyListError> {
    if path.is_empty() {
        return Ok(Loaded::default());
    }
    let unreadable = |e: std::io::Error| DenyListError::Read(path.to_string(), e.to_string());
    let mut reader = BufReader::new(File::open(path).map_err(unreadable)?);
    match sniff(&mut reader).map_err(unreadable)? {
        Format::SdnAdvancedXml => sdn_xml::read(reader)?.found_some(),
        Format::SdnCsv => sdn_csv::read(reader)?.found_some(),
        Format::Lines => lines::read(reader).map_err(|e| match e {
            lines::Error::Io(e) => unreadable(e),
            lines::Error::Entry(line) => DenyListError::Entry(line),
        }),
    }
}

/// XML starts with `<` (after a byte order mark and blank space); a CSV's first record has a
/// comma, which no key of the one-a-line list has. Looks at the first line that is not blank.
fn sniff(reader: &mut impl BufRead) -> std::io::Result<Format> {
    let start = reader.fill_buf()?;
    let start = start.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(start);
    let start = start.trim_ascii_start();
    let text = start.split(|&b| b == b'\n').next().unwrap_or_default();
    Ok(if text.starts_with(b"<") {
        Format::SdnAdvancedXml
    } else if !text.starts_with(b"#") && text.contains(&b',') {
        Format::SdnCsv
    } else {
        Format::Lines
    })
}

/// The list in force, shared by both families' verifiers; replaced whole by a reload.
pub struct DenyLists {
    path: String,
    current: RwLock<Arc<DenyList>>,
}

impl DenyLists {
    /// Reads the file once, for the start: a bad file stops it.
    pub fn load(path: &str) -> Result<(Self, Summary), DenyListError> {
        let loaded = load(path)?;
        let summary = loaded.summary();
        let lists = Self {
            path: path.to_string(),
            current: RwLock::new(Arc::new(loaded.list)),
        };
        Ok((lists, summary))
    }

    /// Whether a file is configured (without one there is nothing to reload).
    pub fn configured(&self) -> bool {
        !self.path.is_empty()
    }

    /// Reads the file again; on failure the list in force stays.
    pub fn reload(&self) -> Result<Summary, DenyListError> {
        let loaded = load(&self.path)?;
        let summary = loaded.summary();
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(loaded.list);
        Ok(summary)
    }

    fn current(&self) -> Arc<DenyList> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn denies_evm(&self, address: &Address) -> bool {
        self.current().evm.contains(address)
    }

    pub fn denies_svm(&self, key: &Pubkey) -> bool {
        self.current().svm.contains(key)
    }

    /// A list of these entries, from no file (a reload has nothing to read).
    pub fn of(list: DenyList) -> Self {
        Self {
            path: String::new(),
            current: RwLock::new(Arc::new(list)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_is_told_by_content() {
        let cases: [(&[u8], Format); 6] = [
            (
                b"\xEF\xBB\xBF<?xml version=\"1.0\"?>\n<Sanctions/>",
                Format::SdnAdvancedXml,
            ),
            (b"\n  <Sanctions>", Format::SdnAdvancedXml),
            (
                b"36,\"AEROCARIBBEAN AIRLINES\",-0- ,\"CUBA\"\n",
                Format::SdnCsv,
            ),
            (
                b"# payers, by hand\n0x00000000000000000000000000000000000000aB\n",
                Format::Lines,
            ),
            (
                b"0x00000000000000000000000000000000000000aB\n",
                Format::Lines,
            ),
            (b"", Format::Lines),
        ];
        for (text, format) in cases {
            assert_eq!(sniff(&mut &text[..]).unwrap(), format, "{text:?}");
        }
    }

    #[test]
    fn an_address_is_taken_by_its_family() {
        let eth = "0x098B716B8Aaf21512996dC57EB0615e2383E2f96";
        let sol = "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU";
        assert!(matches!(classify("ETH", eth), Listed::Evm(_)));
        assert!(matches!(classify("ARB", eth), Listed::Evm(_)));
        assert_eq!(
            classify("ETH", &eth.replace("0x", "0X")),
            classify("ETH", eth)
        );
        assert!(matches!(classify("SOL", sol), Listed::Svm(_)));
        assert!(matches!(classify("USDC", sol), Listed::Svm(_)));
        assert_eq!(classify("ETH", "0x098B716B8Aaf"), Listed::Malformed);
        assert_eq!(classify("SOL", "not-a-key"), Listed::Malformed);
        let tron = "TUoixKFaWVsHxGWgnYyMzpkrT22YqU7VvH";
        assert_eq!(classify("USDT", tron), Listed::OtherChain);
        let xbt = "12QtD5BFwRsdNsAZY76UVE1xyCGNTojH9h";
        assert_eq!(classify("XBT", xbt), Listed::OtherChain);
        // A 32-byte base58 string listed for another chain is not taken as a Solana key.
        assert_eq!(classify("XMR", sol), Listed::OtherChain);
    }

    #[test]
    fn a_reload_replaces_the_list_and_a_bad_file_keeps_it() {
        let path = std::env::temp_dir().join(format!("deny-list-{}", std::process::id()));
        let xml = include_str!("../../../tests/fixtures/sdn/sdn_advanced_sample.xml");
        let csv = include_bytes!("../../../tests/fixtures/sdn/sdn_sample.csv");
        let listed = |a: &str| evm::parse_address(a).unwrap();
        let (in_xml, in_csv) = (
            listed("0x098B716B8Aaf21512996dC57EB0615e2383E2f96"),
            listed("0x8576aCC5C05D6Ce88f4e49bf65BdF0C62F91353C"),
        );
        std::fs::write(&path, xml).unwrap();
        let (lists, loaded) = DenyLists::load(path.to_str().unwrap()).unwrap();
        assert_eq!(loaded.format, Some(Format::SdnAdvancedXml));
        assert!(lists.denies_evm(&in_xml) && !lists.denies_evm(&in_csv));
        std::fs::write(&path, csv).unwrap();
        assert_eq!(lists.reload().unwrap().format, Some(Format::SdnCsv));
        assert!(!lists.denies_evm(&in_xml) && lists.denies_evm(&in_csv));
        std::fs::write(&path, &xml[..xml.len() / 2]).unwrap();
        assert!(lists.reload().is_err(), "a partial download");
        assert!(lists.denies_evm(&in_csv), "the list in force stays");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_summary_says_what_was_taken_and_from_where() {
        let xml = include_str!("../../../tests/fixtures/sdn/sdn_advanced_sample.xml");
        let loaded = sdn_xml::read(xml.as_bytes()).unwrap();
        assert_eq!(
            loaded.summary().to_string(),
            "3 EVM addresses and 1 Solana key from the SDN advanced XML \
             (1 address of other chains left out, 1 not well-formed skipped)"
        );
        let key = "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU";
        let lines = lines::read(format!("{key}\n").as_bytes()).unwrap();
        assert_eq!(
            lines.summary().to_string(),
            "0 EVM addresses and 1 Solana key from the list of one key a line"
        );
    }
}
