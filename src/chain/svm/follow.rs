//! What a cluster's follower reads each tick, in one batch: the block height when a followed
//! transaction may have expired (read first, so that a signature still unknown after a height past
//! its blockhash's last valid one can never land), every followed signature's status
//! (`getSignatureStatuses`, up to 256 a call), and the latest blockhash's `lastValidBlockHeight`
//! when a settlement sent since the last tick has no bound yet.

use serde_json::{json, Value};

use super::{context_value, last_valid_height, SignatureStatus, SolanaChain, SolanaError};
use crate::chain::client::Call;
use crate::chain::traffic::Traffic;

/// Signatures one `getSignatureStatuses` may ask for (a node refuses more).
const STATUSES_PER_CALL: usize = 256;

/// One tick's read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowRead {
    /// When asked for.
    pub block_height: Option<u64>,
    /// One per signature asked, in order: `None` while the cluster does not know it.
    pub statuses: Vec<Option<SignatureStatus>>,
    /// When asked for: no blockhash a payer signed before this read stays valid longer.
    pub last_valid_block_height: Option<u64>,
}

impl SolanaChain {
    /// The statuses of `signatures` (base58), with the block height first when `height`, and the
    /// latest blockhash's last valid block height at the commitment when `bound`.
    pub async fn follow_read(
        &self,
        signatures: &[String],
        height: bool,
        bound: bool,
    ) -> Result<FollowRead, SolanaError> {
        let commitment = json!({"commitment": self.commitment()});
        let mut calls = Vec::new();
        if height {
            calls.push(Call::new("getBlockHeight", vec![commitment.clone()]));
        }
        let history = json!({"searchTransactionHistory": true});
        for chunk in signatures.chunks(STATUSES_PER_CALL) {
            let params = vec![json!(chunk), history.clone()];
            calls.push(Call::new("getSignatureStatuses", params));
        }
        if bound {
            calls.push(Call::new("getLatestBlockhash", vec![commitment]));
        }
        let mut answers = self.client.batch(Traffic::Own, &calls).await?.into_iter();
        let mut next = || {
            answers
                .next()
                .expect("the client answers every call of a batch")
        };
        let block_height = match height {
            true => Some(block_height(next())?),
            false => None,
        };
        let mut statuses = Vec::with_capacity(signatures.len());
        for chunk in signatures.chunks(STATUSES_PER_CALL) {
            const METHOD: &str = "getSignatureStatuses";
            let value = context_value(METHOD, next())?;
            let value = value.as_array().filter(|v| v.len() == chunk.len());
            let value = value.ok_or(SolanaError::Malformed {
                method: METHOD,
                what: "not one status per signature",
            })?;
            statuses.extend(value.iter().map(|s| self.signature_status(s)));
        }
        let last_valid_block_height = match bound {
            true => Some(last_valid_height(next())?),
            false => None,
        };
        Ok(FollowRead {
            block_height,
            statuses,
            last_valid_block_height,
        })
    }
}

fn block_height(answer: Result<Value, crate::chain::client::RpcError>) -> Result<u64, SolanaError> {
    const METHOD: &str = "getBlockHeight";
    let height = answer.map_err(|error| SolanaError::Rpc {
        method: METHOD,
        error,
    })?;
    height.as_u64().ok_or(SolanaError::Malformed {
        method: METHOD,
        what: "not a height",
    })
}
