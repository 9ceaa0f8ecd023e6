//! One log of a receipt or of `eth_getLogs`, as far as routerd reads one: the contract that wrote
//! it, its topics and its data. A log that does not parse whole is no log here.

use ethers_core::types::{Address, H256, U256};
use serde_json::Value;

use super::hex::{hex_decode, parse_h256};
use super::values::parse_address;

pub struct Log {
    pub address: Address,
    pub topics: Vec<H256>,
    pub data: Vec<u8>,
}

impl Log {
    pub fn parse(value: &Value) -> Option<Self> {
        Some(Log {
            address: parse_address(value.get("address")?.as_str()?)?,
            topics: value
                .get("topics")?
                .as_array()?
                .iter()
                .map(|t| t.as_str().and_then(parse_h256))
                .collect::<Option<_>>()?,
            data: hex_decode(value.get("data")?.as_str()?)?,
        })
    }

    /// Whether `contract` wrote it, with topics that begin with `topics`.
    pub fn is(&self, contract: Address, topics: &[H256]) -> bool {
        self.address == contract && self.topics.starts_with(topics)
    }

    /// The last word of its data, when it fits a `uint128`.
    pub fn last_u128(&self) -> Option<u128> {
        let word = self.data.get(self.data.len().checked_sub(32)?..)?;
        let value = U256::from_big_endian(word);
        (value.bits() <= 128).then(|| value.as_u128())
    }
}

/// An address as an indexed event argument.
pub fn address_topic(address: Address) -> H256 {
    H256::from(address)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_log_is_read_whole_or_not_at_all() {
        let (contract, topic) = (Address::repeat_byte(1), H256::repeat_byte(2));
        let mut data = [0u8; 64];
        data[63] = 7;
        let log = json!({
            "address": format!("{contract:#x}"),
            "topics": [format!("{topic:#x}"), format!("{:#x}", address_topic(contract))],
            "data": format!("0x{}", const_hex::encode(data)),
        });
        let read = Log::parse(&log).expect("a whole log");
        assert!(read.is(contract, &[topic]));
        assert!(read.is(contract, &[topic, address_topic(contract)]));
        assert!(!read.is(contract, &[address_topic(contract)]));
        assert!(!read.is(Address::repeat_byte(3), &[topic]));
        assert_eq!(read.last_u128(), Some(7));
        let mut wide = read;
        wide.data = vec![0xff; 32];
        assert_eq!(wide.last_u128(), None, "above a uint128");
        wide.data = vec![1; 31];
        assert_eq!(wide.last_u128(), None, "shorter than a word");
        let mut bad = log.clone();
        bad["topics"][1] = json!("0x12");
        assert!(Log::parse(&bad).is_none(), "one topic that does not parse");
    }
}
