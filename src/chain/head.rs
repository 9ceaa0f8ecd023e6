//! The head of one chain, polled in the background and cached: block number, timestamp and the
//! fee data of that block. Readers never fetch it per request; receipt watchers wake on each
//! new block.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ethers_core::types::U256;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::client::{Call, ChainClient, Unreachable};
use super::fees::Fees;
use super::{parse_quantity, parse_u64};
use crate::config::FeeModel;

#[derive(Debug, Clone)]
pub struct Head {
    pub number: u64,
    pub timestamp: u64,
    pub fees: Fees,
    pub fetched_at: Instant,
}

pub struct HeadWatcher {
    client: Arc<ChainClient>,
    fee_model: FeeModel,
    latest: watch::Receiver<Option<Head>>,
    sender: Arc<watch::Sender<Option<Head>>>,
}

impl HeadWatcher {
    /// Starts the poller; it stops when the watcher is dropped.
    pub fn spawn(client: Arc<ChainClient>, fee_model: FeeModel, interval: Duration) -> Self {
        let (sender, latest) = watch::channel(None);
        let sender = Arc::new(sender);
        let poller_sender = Arc::downgrade(&sender);
        let poller_client = client.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(sender) = poller_sender.upgrade() else {
                    return;
                };
                let last = sender.borrow().as_ref().map(|h: &Head| h.number);
                match fetch_head(&poller_client, fee_model).await {
                    Ok(head) if Some(head.number) != last => {
                        sender.send_replace(Some(head));
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(chain = %poller_client.name(), %error, "head poll failed")
                    }
                }
            }
        });
        Self {
            client,
            fee_model,
            latest,
            sender,
        }
    }

    pub fn current(&self) -> Option<Head> {
        self.latest.borrow().clone()
    }

    pub async fn latest_or_fetch(&self) -> Result<Head, Unreachable> {
        if let Some(head) = self.current() {
            return Ok(head);
        }
        let head = fetch_head(&self.client, self.fee_model).await?;
        self.sender.send_if_modified(|cached| {
            let newer = cached.as_ref().is_none_or(|c| c.number < head.number);
            if newer {
                *cached = Some(head.clone());
            }
            newer
        });
        Ok(head)
    }

    /// A receiver that is notified at every new block.
    pub fn subscribe(&self) -> watch::Receiver<Option<Head>> {
        self.latest.clone()
    }
}

/// One batch: the latest block and both fee hints; which hint applies depends on the block.
async fn fetch_head(client: &ChainClient, fee_model: FeeModel) -> Result<Head, Unreachable> {
    let calls = [
        Call::new("eth_getBlockByNumber", vec![json!("latest"), json!(false)]),
        Call::new("eth_maxPriorityFeePerGas", vec![]),
        Call::new("eth_gasPrice", vec![]),
    ];
    let answers = client.batch(&calls).await?;
    let malformed = |what: &str| Unreachable {
        chain: client.name().to_string(),
        detail: format!("malformed {what} in head block answer"),
    };
    let block = answers[0].as_ref().map_err(|e| malformed(&e.message))?;
    let number = block
        .get("number")
        .and_then(parse_u64)
        .ok_or_else(|| malformed("number"))?;
    let timestamp = block
        .get("timestamp")
        .and_then(parse_u64)
        .ok_or_else(|| malformed("timestamp"))?;
    let base_fee = block.get("baseFeePerGas").and_then(parse_quantity);
    let gas_price = answers[2].as_ref().ok().and_then(parse_quantity);
    let use_1559 = match fee_model {
        FeeModel::Legacy => false,
        FeeModel::Eip1559 | FeeModel::OpStack => true,
        FeeModel::Auto => base_fee.is_some(),
    };
    let fees = if use_1559 {
        let base_fee = base_fee.unwrap_or_default();
        let priority_fee = match answers[1].as_ref().ok().and_then(parse_quantity) {
            Some(tip) => tip,
            None => priority_from_fee_history(client)
                .await
                .unwrap_or_else(|| U256::from(1_000_000_000u64)),
        };
        Fees::Eip1559 {
            base_fee,
            priority_fee,
        }
    } else {
        Fees::Legacy {
            gas_price: gas_price.ok_or_else(|| malformed("gas price"))?,
        }
    };
    Ok(Head {
        number,
        timestamp,
        fees,
        fetched_at: Instant::now(),
    })
}

/// The median tip of the last few blocks, for nodes without `eth_maxPriorityFeePerGas`.
async fn priority_from_fee_history(client: &ChainClient) -> Option<U256> {
    let answer = client
        .call(
            "eth_feeHistory",
            vec![json!("0x5"), json!("latest"), json!([50])],
        )
        .await
        .ok()?
        .ok()?;
    let mut tips: Vec<U256> = answer
        .get("reward")?
        .as_array()?
        .iter()
        .filter_map(|r: &Value| r.get(0).and_then(parse_quantity))
        .collect();
    tips.sort();
    tips.get(tips.len() / 2).copied()
}
