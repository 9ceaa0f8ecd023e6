//! What a chain's own endpoint (`POST /chains/<name>`) serves: the reads a wallet needs and the
//! send, and nothing that changes or reveals node state (`anvil_*`, `debug_*`, `admin_*`,
//! `personal_*`, `txpool_*`, `eth_sign*`, `eth_sendTransaction` and every method not listed).

/// How a served method is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// From the configuration: viem and ethers ask it before nearly every call.
    ChainId,
    /// Through the relay: checked against the endpoint's chain, remembered, confirmed.
    SendRaw,
    /// Forwarded as it is to the chain's upstream, with failover.
    Forward(&'static str),
}

/// The reads forwarded as they are (within `reads::check`'s bounds).
const READS: [&str; 13] = [
    "eth_blockNumber",
    "eth_getBalance",
    "eth_getTransactionCount",
    "eth_call",
    "eth_estimateGas",
    "eth_gasPrice",
    "eth_maxPriorityFeePerGas",
    "eth_feeHistory",
    "eth_getBlockByNumber",
    "eth_getBlockByHash",
    "eth_getTransactionReceipt",
    "eth_getTransactionByHash",
    "eth_getCode",
];

/// How `method` is answered, or `None` when it is not served.
pub fn served(method: &str) -> Option<Served> {
    match method {
        "eth_chainId" => Some(Served::ChainId),
        "eth_sendRawTransaction" => Some(Served::SendRaw),
        other => READS
            .iter()
            .find(|read| **read == other)
            .map(|read| Served::Forward(read)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_the_wallet_reads_and_nothing_that_changes_or_reveals_node_state() {
        assert_eq!(served("eth_chainId"), Some(Served::ChainId));
        assert_eq!(served("eth_sendRawTransaction"), Some(Served::SendRaw));
        assert_eq!(
            served("eth_getBalance"),
            Some(Served::Forward("eth_getBalance"))
        );
        assert_eq!(
            served("eth_getBlockByHash"),
            Some(Served::Forward("eth_getBlockByHash"))
        );
        for refused in [
            "anvil_setBalance",
            "debug_traceTransaction",
            "admin_peers",
            "personal_sign",
            "txpool_content",
            "eth_sign",
            "eth_signTransaction",
            "eth_sendTransaction",
            "eth_accounts",
            "eth_routerTransaction",
            "ETH_GETBALANCE",
            "",
        ] {
            assert_eq!(served(refused), None, "{refused}");
        }
    }
}
