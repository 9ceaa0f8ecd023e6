//! The Treasury's SDN advanced XML (`sdn_advanced.xml`), read as a stream: the published file is
//! about 100 MB, and only a few hundred of its values matter here.
//!
//! Its `<ReferenceValueSets>/<FeatureTypeValues>` come first and name each feature type, among
//! them `<FeatureType ID="345">Digital Currency Address - ETH</FeatureType>`; each party's
//! `<Profile>` then carries `<Feature FeatureTypeID="345">`, whose `<FeatureVersion>`'s
//! `<VersionDetail>` holds the address. Elements are matched by local name, so the namespace
//! the file is published under (it has changed before) does not matter.

use std::collections::HashMap;
use std::io::BufRead;

use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use super::{classify, DenyListError, Format, Loaded};

const FEATURE_TYPE_PREFIX: &str = "Digital Currency Address - ";

/// The text being gathered, and what it will be.
enum Capture {
    /// A feature type's name, for its ID.
    FeatureType(String),
    /// An address listed under that ticker.
    Address(String),
}

#[derive(Default)]
struct Walk {
    loaded: Option<Loaded>,
    /// The Digital Currency Address feature types by ID: their ticker (`ETH`, `SOL`...).
    tickers: HashMap<String, String>,
    /// The ticker of the digital currency `<Feature>` being read.
    feature: Option<String>,
    capture: Option<Capture>,
    text: String,
    depth: usize,
}

pub fn read(reader: impl BufRead) -> Result<Loaded, DenyListError> {
    let mut xml = Reader::from_reader(reader);
    let mut walk = Walk::default();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let event = xml
            .read_event_into(&mut buf)
            .map_err(|e| DenyListError::Xml {
                position: xml.error_position(),
                reason: e.to_string(),
            })?;
        match event {
            Event::Start(element) => walk.open(&element)?,
            Event::End(element) => walk.close(element.local_name().as_ref()),
            Event::Empty(element) if walk.depth == 0 => walk.root(&element)?,
            Event::Text(text) => walk.gather(&text.xml10_content()),
            Event::CData(text) => walk.gather(&text),
            Event::GeneralRef(entity) => {
                let resolved = match entity.resolve_char_ref() {
                    Ok(Some(c)) => c.to_string(),
                    _ => resolve_predefined_entity(&entity)
                        .unwrap_or_default()
                        .to_string(),
                };
                walk.gather(&resolved);
            }
            Event::Eof => return walk.end(),
            _ => {}
        }
    }
}

impl Walk {
    /// The document's element must be `<Sanctions>`: another XML file is not the list.
    fn root(&mut self, element: &BytesStart<'_>) -> Result<(), DenyListError> {
        if self.loaded.is_some() {
            return Err(DenyListError::AfterRoot);
        }
        let name = element.local_name();
        if name.as_ref() != "Sanctions" {
            return Err(DenyListError::NotSdnXml(name.as_ref().to_string()));
        }
        self.loaded = Some(Loaded::new(Format::SdnAdvancedXml));
        Ok(())
    }

    fn open(&mut self, element: &BytesStart<'_>) -> Result<(), DenyListError> {
        if self.depth == 0 {
            self.root(element)?;
        }
        self.depth += 1;
        let attribute = |name: &str| {
            let found = element.try_get_attribute(name).ok().flatten();
            found.map(|a| a.value.into_owned())
        };
        match element.local_name().as_ref() {
            "FeatureType" => self.start(attribute("ID").map(Capture::FeatureType)),
            "Feature" => {
                let id = attribute("FeatureTypeID");
                self.feature = id.and_then(|id| self.tickers.get(&id).cloned());
            }
            "VersionDetail" => self.start(self.feature.clone().map(Capture::Address)),
            _ => {}
        }
        Ok(())
    }

    fn start(&mut self, capture: Option<Capture>) {
        self.capture = capture;
        self.text.clear();
    }

    fn gather(&mut self, text: &str) {
        if self.capture.is_some() {
            self.text.push_str(text);
        }
    }

    fn close(&mut self, name: &str) {
        self.depth = self.depth.saturating_sub(1);
        match (name, self.capture.take()) {
            ("FeatureType", Some(Capture::FeatureType(id))) => {
                if let Some(ticker) = self.text.trim().strip_prefix(FEATURE_TYPE_PREFIX) {
                    self.tickers.insert(id, ticker.trim().to_string());
                }
            }
            ("VersionDetail", Some(Capture::Address(ticker))) => {
                let listed = classify(&ticker, self.text.trim());
                self.loaded.as_mut().expect("root read").take(listed);
            }
            ("Feature", capture) => {
                self.feature = None;
                self.capture = capture;
            }
            (_, capture) => self.capture = capture,
        }
    }

    /// A download cut short ends with elements open: taking what came before would shrink the
    /// list without a word.
    fn end(self) -> Result<Loaded, DenyListError> {
        if self.depth > 0 {
            return Err(DenyListError::Truncated);
        }
        self.loaded
            .ok_or_else(|| DenyListError::NotSdnXml("nothing".to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;
    use crate::evm;
    use crate::svm::Pubkey;

    const SAMPLE: &str = include_str!("../../../tests/fixtures/sdn/sdn_advanced_sample.xml");

    #[test]
    fn the_sample_gives_its_evm_and_solana_addresses() {
        let loaded = read(SAMPLE.as_bytes()).unwrap();
        assert_eq!(loaded.format, Some(Format::SdnAdvancedXml));
        let evm = [
            "0x098B716B8Aaf21512996dC57EB0615e2383E2f96",
            "0xa0e1c89Ef1a489c9C7dE96311eD5Ce5D32c20E4B",
            "0x7F367cC41522cE07553e823bf3be79A889DEbe1B",
        ];
        let evm = evm.map(|a| evm::parse_address(a).unwrap());
        assert_eq!(loaded.list.evm, evm.into());
        let sol = Pubkey::from_str("Fq3pRa6QUEvgmjWsePtFvgt2VSQe2UnspTMaGbRCrSys").unwrap();
        assert_eq!(loaded.list.svm, [sol].into());
        assert_eq!((loaded.other_chains, loaded.malformed), (1, 1));
    }

    #[test]
    fn another_document_a_cut_one_and_broken_xml_are_refused() {
        let other = "<?xml version=\"1.0\"?><sdnList><sdnEntry/></sdnList>";
        assert!(matches!(
            read(other.as_bytes()),
            Err(DenyListError::NotSdnXml(root)) if root == "sdnList"
        ));
        let cut = &SAMPLE[..SAMPLE.find("</DistinctParties>").unwrap()];
        assert!(matches!(
            read(cut.as_bytes()),
            Err(DenyListError::Truncated)
        ));
        let twice = format!("{SAMPLE}<Sanctions/>");
        assert!(matches!(
            read(twice.as_bytes()),
            Err(DenyListError::AfterRoot)
        ));
        let broken = SAMPLE.replacen("</Profile>", "</Profil>", 1);
        assert!(matches!(
            read(broken.as_bytes()),
            Err(DenyListError::Xml { .. })
        ));
    }

    #[test]
    fn the_namespace_does_not_matter() {
        let old = SAMPLE.replace(
            "https://sanctionslistservice.ofac.treas.gov/api/PublicationPreview/exports/ADVANCED_XML",
            "http://www.un.org/sanctions/1.0",
        );
        assert_eq!(read(old.as_bytes()).unwrap().list.evm.len(), 3);
    }
}
