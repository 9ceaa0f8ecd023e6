//! One candidate chain: the batched upstream request of router.md §3 and what its answers mean.

use std::time::{Duration, Instant};

use ethers_core::abi::{encode, Token};
use ethers_core::types::transaction::eip2718::TypedTransaction;
use ethers_core::types::{Address, Eip1559TransactionRequest, U256};
use ethers_core::utils::keccak256;
use serde_json::{json, Value};

use super::types::Transaction;
use crate::chain::{self, Answered, Batch, Call, CallResult, Chain, RpcError, Slot};
use crate::chain::{Budget, Traffic};
use crate::config::FeeModel;
use crate::evm;
use crate::evm::Fees;

/// What one chain said about a transaction.
#[derive(Debug, Clone)]
pub struct Probe {
    pub outcome: Result<Estimate, Infeasible>,
    pub latency: Duration,
}

#[derive(Debug, Clone)]
pub struct Estimate {
    pub gas_estimate: u64,
    pub pending_nonce: u64,
    pub balance: U256,
    pub fees: Fees,
    pub l1_fee: U256,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Infeasible {
    Reverted(String),
    InsufficientBalance {
        needed: U256,
        balance: U256,
    },
    /// The node refused to estimate for lack of funds: the full bill is unknown.
    CannotPayForEstimate {
        balance: U256,
    },
    NoCodeAtTo,
    Unreachable(String),
}

impl std::fmt::Display for Infeasible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Infeasible::Reverted(reason) => write!(f, "reverted: {reason}"),
            Infeasible::InsufficientBalance { needed, balance } => {
                write!(
                    f,
                    "insufficient balance: needs {needed} wei, has {balance} wei"
                )
            }
            Infeasible::CannotPayForEstimate { balance } => {
                write!(f, "insufficient balance: has {balance} wei, too little for the node to estimate the call")
            }
            Infeasible::NoCodeAtTo => write!(f, "no code at `to` while `data` is not empty"),
            Infeasible::Unreachable(detail) => write!(f, "unreachable: {detail}"),
        }
    }
}

/// The OP-stack `GasPriceOracle` predeploy.
pub fn oracle_address() -> Address {
    "0x420000000000000000000000000000000000000F"
        .parse()
        .expect("constant address")
}

/// Asks `chain` everything needed in one batch, bounded by `timeout`.
pub async fn probe(
    chain: &Chain,
    tx: &Transaction,
    known_code: Option<bool>,
    timeout: Duration,
) -> Probe {
    let started = Instant::now();
    let outcome = match tokio::time::timeout(timeout, ask(chain, tx, known_code)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Infeasible::Unreachable(format!(
            "no answer within {} ms",
            timeout.as_millis()
        ))),
    };
    Probe {
        outcome,
        latency: started.elapsed(),
    }
}

/// Whether `to` has code, from the `eth_getCode` answer. A node that could not answer leaves
/// the chain's feasibility unknown.
fn learnt_code(answer: &CallResult) -> Result<bool, Infeasible> {
    match answer {
        Ok(code) => Ok(code.as_str().is_some_and(|c| c.len() > 2)),
        Err(e) => Err(Infeasible::Unreachable(format!("eth_getCode: {e}"))),
    }
}

/// Where each answer of the probe's batch is.
struct Asked {
    estimate: Slot,
    nonce: Slot,
    balance: Slot,
    /// `eth_getCode` of `to`, unless known already.
    code: Option<Slot>,
    /// `GasPriceOracle.getL1Fee`, on an OP-stack chain.
    l1_fee: Option<Slot>,
}

/// The batch of router.md §3 for `tx` on `chain`.
fn batch_for(
    chain: &Chain,
    tx: &Transaction,
    fees: &Fees,
    known_code: Option<bool>,
) -> (Batch, Asked) {
    let from = json!(evm::hex_bytes(tx.from));
    let mut call =
        json!({"from": from, "data": evm::hex_bytes(&tx.data), "value": evm::hex_u256(tx.value)});
    if let Some(to) = tx.to {
        call["to"] = json!(evm::hex_bytes(to));
    }
    let mut batch = Batch::new();
    let estimate = batch.add(Call::new("eth_estimateGas", vec![call]));
    let nonce = batch.add(Call::new(
        "eth_getTransactionCount",
        vec![from.clone(), json!("pending")],
    ));
    let balance = batch.add(Call::new("eth_getBalance", vec![from, json!("latest")]));
    let code = match tx.to {
        Some(to) if known_code.is_none() && !tx.data.is_empty() => Some(batch.add(Call::new(
            "eth_getCode",
            vec![json!(evm::hex_bytes(to)), json!("latest")],
        ))),
        _ => None,
    };
    let l1_fee = (chain.settings.fee_model == FeeModel::OpStack).then(|| {
        let unsigned = unsigned_rlp(chain.settings.chain_id, tx, fees);
        batch.add(chain::eth_call(
            oracle_address(),
            &get_l1_fee_call(&unsigned),
            "latest",
        ))
    });
    let asked = Asked {
        estimate,
        nonce,
        balance,
        code,
        l1_fee,
    };
    (batch, asked)
}

async fn ask(
    chain: &Chain,
    tx: &Transaction,
    known_code: Option<bool>,
) -> Result<Estimate, Infeasible> {
    let _read = chain
        .client
        .admit(Budget::Router)
        .map_err(|busy| Infeasible::Unreachable(busy.to_string()))?;
    let head = chain
        .latest_head()
        .await
        .map_err(|e| Infeasible::Unreachable(e.detail))?;
    let (batch, asked) = batch_for(chain, tx, &head.fees, known_code);
    let answers = chain
        .client
        .ask(Traffic::Callers, &batch)
        .await
        .map_err(|e| Infeasible::Unreachable(e.detail))?;
    let has_code = match asked.code {
        Some(code) => Some(learnt_code(answers.get(code))?),
        None => known_code,
    };
    interpret(&answers, &asked, tx, head.fees, has_code)
}

fn interpret(
    answers: &Answered,
    asked: &Asked,
    tx: &Transaction,
    fees: Fees,
    has_code: Option<bool>,
) -> Result<Estimate, Infeasible> {
    if tx.to.is_some() && !tx.data.is_empty() && has_code == Some(false) {
        return Err(Infeasible::NoCodeAtTo);
    }
    let quantity = |slot: Slot, what: &str| -> Result<U256, Infeasible> {
        match answers.get(slot) {
            Ok(v) => evm::parse_quantity(v)
                .ok_or_else(|| Infeasible::Unreachable(format!("malformed {what}: {v}"))),
            Err(e) => Err(Infeasible::Unreachable(format!("{what}: {e}"))),
        }
    };
    let balance = quantity(asked.balance, "eth_getBalance")?;
    let gas_estimate = match answers.get(asked.estimate) {
        Ok(v) => evm::parse_u64(v)
            .ok_or_else(|| Infeasible::Unreachable(format!("malformed estimate {v}")))?,
        Err(e) if is_insufficient_funds(e) => {
            return Err(Infeasible::CannotPayForEstimate { balance })
        }
        Err(e) if e.is_execution_failure() => return Err(Infeasible::Reverted(revert_reason(e))),
        // Rate-limited, mid-reorganisation, internal: the node said nothing about the call.
        Err(e) => return Err(Infeasible::Unreachable(format!("eth_estimateGas: {e}"))),
    };
    let pending_nonce = quantity(asked.nonce, "eth_getTransactionCount")?.low_u64();
    let l1_fee = match asked.l1_fee {
        Some(slot) => l1_fee(answers.get(slot))?,
        None => U256::zero(),
    };
    Ok(Estimate {
        gas_estimate,
        pending_nonce,
        balance,
        fees,
        l1_fee,
    })
}

/// The OP-stack chain's L1 data fee. Without it the chain's cost is unknown, and taking it for
/// zero would make the chain look cheaper than it is.
fn l1_fee(answer: &CallResult) -> Result<U256, Infeasible> {
    match answer {
        Ok(v) => evm::parse_word(v).ok_or_else(|| {
            Infeasible::Unreachable(format!("malformed GasPriceOracle.getL1Fee answer {v}"))
        }),
        Err(e) => Err(Infeasible::Unreachable(format!(
            "GasPriceOracle.getL1Fee: {e}"
        ))),
    }
}

fn is_insufficient_funds(e: &RpcError) -> bool {
    let m = e.message.to_lowercase();
    m.contains("insufficient funds") || m.contains("insufficient balance")
}

/// The node's revert reason: `Error(string)` data decoded when present, else its message.
pub fn revert_reason(e: &RpcError) -> String {
    let data = e.data.as_ref().and_then(|d| match d {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("data").and_then(|v| v.as_str()).map(str::to_string),
        _ => None,
    });
    data.as_deref()
        .and_then(evm::hex_decode)
        .and_then(|bytes| evm::error_string(&bytes))
        .unwrap_or_else(|| e.message.clone())
}

/// The unsigned transaction the OP-stack oracle prices: its size is what the L1 fee depends on.
fn unsigned_rlp(chain_id: u64, tx: &Transaction, fees: &Fees) -> Vec<u8> {
    let mut request = Eip1559TransactionRequest::new()
        .from(tx.from)
        .data(tx.data.clone())
        .value(tx.value)
        .chain_id(chain_id)
        .nonce(0)
        .gas(1_000_000)
        .max_fee_per_gas(fees.max_fee_per_gas())
        .max_priority_fee_per_gas(
            fees.effective_price()
                .saturating_sub(fees.max_fee_per_gas() / 2),
        );
    if let Some(to) = tx.to {
        request = request.to(to);
    }
    let typed: TypedTransaction = request.into();
    typed.rlp().to_vec()
}

fn get_l1_fee_call(unsigned: &[u8]) -> Vec<u8> {
    let mut data = keccak256("getL1Fee(bytes)")[..4].to_vec();
    data.extend(encode(&[Token::Bytes(unsigned.to_vec())]));
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_error_string_revert_data() {
        let mut data = keccak256("Error(string)")[..4].to_vec();
        data.extend(encode(&[Token::String("not owner".into())]));
        let e = RpcError {
            code: 3,
            message: "execution reverted".into(),
            data: Some(json!(evm::hex_bytes(&data))),
        };
        assert_eq!(revert_reason(&e), "not owner");
        let plain = RpcError {
            code: -32000,
            message: "execution reverted".into(),
            data: None,
        };
        assert_eq!(revert_reason(&plain), "execution reverted");
    }
}
