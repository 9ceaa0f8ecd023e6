//! The one batched read of the chain a verify (and a settle's trial) makes: the payer's code,
//! balance, nonce and allowances, blacklists, the ERC-6492 deployment, ERC-1271 and the
//! settlement tried, through the lens where the node runs state overrides, else as separate
//! calls of one batch. A node's answer that does not parse is `Unreachable`, never a verdict.

use ethers_core::types::{Address, Bytes, U256};
use serde_json::{json, Value};

use super::{Network, Payment, SettleGas};
use crate::chain::Traffic;
use crate::chain::{self, Batch, Call, CallResult, Chain, ReadMode, Slot, Unreachable};
use crate::evm;
use crate::evm::erc3009;
use crate::evm::erc6492;
use crate::evm::permit2;
use crate::evm::NonceRead;
use crate::facilitator::evm::lens;

/// What the chain says about a payment, read in one batch.
#[derive(Debug, Clone)]
pub(super) struct ChainFacts {
    pub(super) from_has_code: bool,
    pub(super) balance: U256,
    pub(super) authorization_used: bool,
    /// The payer's approval of Permit2, for a Permit2 payment.
    pub(super) permit2_allowance: Option<U256>,
    pub(super) from_blacklisted: bool,
    pub(super) to_blacklisted: bool,
    /// After the ERC-6492 deployment asked, inside the read only.
    pub(super) wallet_has_code: bool,
    /// Why the read could not run the deployment asked, when it could not.
    pub(super) deployment_unavailable: Option<&'static str>,
    /// `Some` when ERC-1271 was asked: the signature did not recover to `from` locally.
    pub(super) erc1271_valid: Option<bool>,
    /// `Some` when the payment carries an EIP-2612 permit: whether the token takes it.
    pub(super) eip2612_accepted: Option<bool>,
    pub(super) block_timestamp: u64,
}

/// The settlement transaction a settle tries before it claims: from the lane's signer, to the
/// payment's token, at a real gas price (a wallet that answers a free call differently than
/// the transaction is seen here, not on chain at the operator's expense).
pub struct Trial<'a> {
    pub sender: Address,
    /// The target acts only on a transaction from `sender` (x402's upto proxy): tried as an
    /// `eth_estimateGas` from it, not by the lens, whose call comes from its own address.
    pub sender_bound: bool,
    /// The token, or Multicall3 when the settlement deploys the wallet first.
    pub target: Address,
    pub calldata: &'a [u8],
    pub gas_price: U256,
}

/// Gas the lens's reads and ERC-1271 call may take beside the trial.
const LENS_READS_GAS: u64 = 300_000;

/// The lens call as the settlement will be sent: from the signer, at the trial's gas price,
/// with gas for the reads and twice the settlement bound (enough to measure a settlement
/// over the bound, and no more).
fn as_settlement(mut call: Call, trial: &Trial<'_>, max_settlement_gas: u64) -> Call {
    let gas = LENS_READS_GAS.saturating_add(max_settlement_gas.saturating_mul(2));
    // Run as the settlement's sender, with its gas: it goes alone, not in another's call.
    call.merge = None;
    if let Some(tx) = call.params.first_mut().and_then(Value::as_object_mut) {
        tx.insert("from".into(), json!(evm::hex_bytes(trial.sender)));
        tx.insert("gasPrice".into(), json!(format!("{:#x}", trial.gas_price)));
        tx.insert("gas".into(), json!(format!("{gas:#x}")));
    }
    call
}

/// The payer, as the settle's chain read saw it.
#[derive(Debug, Clone, Copy)]
pub struct Payer {
    pub balance: U256,
    /// A smart wallet: its code may answer the chain differently than the trial.
    pub is_contract: bool,
    /// Its approval of Permit2, for a Permit2 payment.
    pub permit2_allowance: Option<U256>,
}

/// What trying the settlement transaction said.
#[derive(Debug, Clone, PartialEq)]
pub enum Tried {
    /// The gas the whole transaction takes, before any headroom.
    Gas(u64),
    /// The token would revert it, for this reason.
    Reverted(String),
}

/// Gas assumed when a node answers an estimate it cannot parse (USDC's call uses about 80 000).
const FALLBACK_GAS_LIMIT: u64 = 150_000;

/// Reads the chain facts in the chain's read mode: one lens call where the node runs state
/// overrides, a batch of plain reads where it does not. A `trial` is tried in the same request:
/// by the lens, or as an `eth_estimateGas` in the batch.
pub(super) async fn read_chain(
    payment: &Payment<'_>,
    trial: Option<&Trial<'_>>,
) -> Result<(ChainFacts, Option<Tried>), Unreachable> {
    let chain = &payment.network.chain;
    // A node that does not answer the probe would not answer the batch either: its one timeout
    // is this request's answer, so a hanging node costs one timeout, not two.
    if chain.learn_read_mode().await? == ReadMode::Lens {
        match read_with_lens(payment, trial).await? {
            LensRead::Read(read) => return Ok(read),
            // The node ran the lens and this payment's wallet used its gas up: that says
            // nothing of the node, so only this request is read the other way.
            LensRead::Halted => {}
            LensRead::NotRun => chain.forget_read_mode("the node did not run the verify lens"),
        }
    }
    read_in_batch(payment, trial).await
}

/// ERC-1271 is asked only when the signature does not recover to `from` locally.
fn asks_erc1271(payment: &Payment<'_>) -> bool {
    payment.recovered != Some(payment.auth.from)
}

/// What one `eth_call` of the lens gave.
enum LensRead {
    Read((ChainFacts, Option<Tried>)),
    /// The EVM stopped it (out of gas in a payer's wallet, say).
    Halted,
    /// The node did not run it: no state overrides here.
    NotRun,
}

/// One `eth_call` of the lens.
async fn read_with_lens(
    payment: &Payment<'_>,
    trial: Option<&Trial<'_>>,
) -> Result<LensRead, Unreachable> {
    let auth = &payment.auth;
    let ask_erc1271 = asks_erc1271(payment);
    let erc1271_call = match ask_erc1271 {
        true => erc3009::is_valid_signature(payment.digest, &payment.signature).to_vec(),
        false => Vec::new(),
    };
    let network = payment.network;
    let source = network.settle_gas.get().copied();
    let lens_tries = trial.filter(|t| !t.sender_bound && source != Some(SettleGas::Estimate));
    let estimate = trial
        .filter(|t| t.sender_bound || source != Some(SettleGas::Trial))
        .map(|trial| estimate_call(trial));
    let nonce_read = payment.nonce_read();
    let permit_call = eip2612_call(payment);
    let facts = lens::call(&lens::Ask {
        token: payment.token.address,
        from: auth.from,
        pay_to: payment.pay_to,
        nonce_read: &nonce_read,
        allowance_spender: payment.method.is_permit2().then_some(permit2::PERMIT2),
        deployment: payment.counterfactual.deployment(),
        erc1271_call: &erc1271_call,
        trial_target: lens_tries.map_or(Address::zero(), |t| t.target),
        trial_call: lens_tries.map_or(&[], |t| t.calldata),
        permit_call: permit_call.as_deref().unwrap_or_default(),
    });
    let max_gas = network.chain.settings.max_settlement_gas;
    let mut batch = Batch::new();
    let lens = batch.add(match lens_tries {
        Some(trial) => as_settlement(facts, trial, max_gas),
        None => facts,
    });
    let estimate = estimate.map(|call| batch.add(call));
    let chain = &network.chain;
    let answers = chain.client.ask(Traffic::Callers, &batch).await?;
    let read = match answers.get(lens) {
        Err(e) if e.is_execution_failure() => return Ok(LensRead::Halted),
        answer => answer.as_ref().ok().and_then(lens::decode_answer),
    };
    let Some(read) = read else {
        return Ok(LensRead::NotRun);
    };
    let by_lens = lens_tries
        .map(|trial| lens_tried(chain, trial, read.trial.as_ref()))
        .transpose()?;
    let by_estimate = estimate
        .map(|slot| estimate_tried(chain, answers.get(slot)))
        .transpose()?;
    let tried = both_tried(network, by_lens, by_estimate);
    let token_said = |value: Option<U256>, what: &str| {
        value.ok_or_else(|| unreadable(chain, what, "the token did not answer".into()))
    };
    let facts = ChainFacts {
        from_has_code: !read.from_code_size.is_zero(),
        wallet_has_code: !read.wallet_code_size.is_zero(),
        deployment_unavailable: None,
        balance: token_said(read.balance, "balanceOf")?,
        authorization_used: nonce_read.used(token_said(read.authorization_state, "the nonce")?),
        permit2_allowance: match payment.method.is_permit2() {
            true => Some(token_said(read.allowance, "allowance")?),
            false => None,
        },
        from_blacklisted: read.from_blacklisted,
        to_blacklisted: read.to_blacklisted,
        erc1271_valid: ask_erc1271.then(|| erc1271_accepted(&read.erc1271_answer)),
        eip2612_accepted: permit_call.is_some().then_some(read.permit_accepted),
        block_timestamp: read.timestamp,
    };
    Ok(LensRead::Read((facts, tried)))
}

/// The settlement as the lens tried it and as the node estimated it: a revert by either is the
/// answer; with both, the larger gas (and the network learns which of the two to ask next).
fn both_tried(
    network: &Network,
    by_lens: Option<Tried>,
    by_estimate: Option<Tried>,
) -> Option<Tried> {
    match (by_lens, by_estimate) {
        (Some(Tried::Gas(tried)), Some(Tried::Gas(estimated))) => {
            network.learn_settle_gas(tried, estimated);
            Some(Tried::Gas(tried.max(estimated)))
        }
        (Some(Tried::Reverted(reason)), _) | (_, Some(Tried::Reverted(reason))) => {
            Some(Tried::Reverted(reason))
        }
        (by_lens, by_estimate) => by_lens.or(by_estimate),
    }
}

/// The token's `permit` call of the payment's EIP-2612 permit, if it carries one.
fn eip2612_call(payment: &Payment<'_>) -> Option<Bytes> {
    let permit = payment.eip2612.as_ref()?;
    Some(permit.call(payment.auth.from))
}

/// Where each fact of [`read_in_batch`] is answered.
struct FactSlots {
    code: Slot,
    balance: Slot,
    state: Slot,
    /// How `state`'s answer says the nonce is used.
    nonce_read: NonceRead,
    /// Permit2's approval, for a Permit2 payment.
    allowance: Option<Slot>,
    from_listed: Slot,
    to_listed: Slot,
    erc1271: Option<Slot>,
    /// The deployment and ERC-1271 through Multicall3, for a wallet not yet deployed.
    deployed: Option<Slot>,
    /// The payment's EIP-2612 permit as an `eth_call` on the token, when it carries one.
    permit: Option<Slot>,
    estimate: Option<Slot>,
}

/// The facts as separate calls in one batch, and a trial as an `eth_estimateGas`.
fn facts_batch(payment: &Payment<'_>, trial: Option<&Trial<'_>>) -> (Batch, FactSlots) {
    let auth = &payment.auth;
    let token = payment.token.address;
    let read = |to, data: Bytes| chain::eth_call(to, &data, "latest");
    let deployment = payment.counterfactual.deployment();
    let nonce_read = payment.nonce_read();
    let erc1271_call = erc3009::is_valid_signature(payment.digest, &payment.signature);
    let mut batch = Batch::new();
    let slots = FactSlots {
        code: batch.add(Call::new(
            "eth_getCode",
            vec![json!(evm::hex_bytes(auth.from)), json!("latest")],
        )),
        balance: batch.add(read(token, erc3009::balance_of(auth.from))),
        state: batch.add(read(nonce_read.target, nonce_read.call.clone())),
        nonce_read,
        allowance: payment
            .method
            .is_permit2()
            .then(|| batch.add(read(token, permit2::allowance(auth.from)))),
        from_listed: batch.add(read(token, erc3009::is_blacklisted(auth.from))),
        to_listed: batch.add(read(token, erc3009::is_blacklisted(payment.pay_to))),
        erc1271: (asks_erc1271(payment) && deployment.is_none())
            .then(|| batch.add(read(auth.from, erc1271_call.clone()))),
        deployed: deployment.map(|d| {
            let call = erc6492::deploy_then_read(d, auth.from, &erc1271_call);
            batch.add(read(erc6492::MULTICALL3, call))
        }),
        permit: eip2612_call(payment).map(|call| batch.add(read(token, call))),
        estimate: trial.map(|trial| batch.add(estimate_call(trial))),
    };
    (batch, slots)
}

/// The same facts as the lens reads, from separate calls in one batch. The block time comes
/// from the head watcher.
async fn read_in_batch(
    payment: &Payment<'_>,
    trial: Option<&Trial<'_>>,
) -> Result<(ChainFacts, Option<Tried>), Unreachable> {
    let (batch, slots) = facts_batch(payment, trial);
    let chain = &payment.network.chain;
    let answers = chain.client.ask(Traffic::Callers, &batch).await?;
    let word = |slot: Slot, what: &str| -> Result<U256, Unreachable> {
        match answers.get(slot) {
            Ok(v) => evm::parse_word(v)
                .ok_or_else(|| unreadable(chain, what, format!("unexpected answer {v}"))),
            Err(e) => Err(unreadable(chain, what, e.to_string())),
        }
    };
    // A token without a blacklist reverts `isBlacklisted`: nobody is blacklisted there. A node
    // that could not run the call (a block it no longer has) said nothing about anybody.
    let flag = |slot: Slot, what: &str| match answers.get(slot) {
        Ok(v) => Ok(evm::parse_word(v).is_some_and(|w| !w.is_zero())),
        Err(e) if e.is_revert() => Ok(false),
        Err(e) => Err(unreadable(chain, what, e.to_string())),
    };
    let code = answers
        .get(slots.code)
        .as_ref()
        .map_err(|e| unreadable(chain, "eth_getCode", e.to_string()))?;
    // A wallet whose `isValidSignature` reverts or halts (burns its gas, hits an invalid
    // opcode) does not accept the signature: the payer wrote that code. A node that could not
    // run the call did not say so.
    let erc1271_answer = |answer: &CallResult| match answer {
        Ok(v) => Ok(erc1271_accepted(
            &v.as_str().and_then(evm::hex_decode).unwrap_or_default(),
        )),
        Err(e) if e.is_execution_failure() => Ok(false),
        Err(e) => Err(unreadable(chain, "isValidSignature", e.to_string())),
    };
    let from_has_code = code.as_str().is_some_and(|c| c.len() > 2);
    let mut facts = ChainFacts {
        from_has_code,
        wallet_has_code: from_has_code,
        deployment_unavailable: None,
        balance: word(slots.balance, "balanceOf")?,
        authorization_used: slots.nonce_read.used(word(slots.state, "the nonce")?),
        permit2_allowance: slots
            .allowance
            .map(|slot| word(slot, "allowance"))
            .transpose()?,
        from_blacklisted: flag(slots.from_listed, "isBlacklisted(from)")?,
        to_blacklisted: flag(slots.to_listed, "isBlacklisted(payTo)")?,
        erc1271_valid: slots
            .erc1271
            .map(|slot| erc1271_answer(answers.get(slot)))
            .transpose()?,
        eip2612_accepted: slots
            .permit
            .map(|slot| permit_accepted(chain, answers.get(slot)))
            .transpose()?,
        block_timestamp: chain.head.current().map_or(0, |head| head.timestamp),
    };
    if let Some(slot) = slots.deployed {
        read_deployed(&mut facts, chain, answers.get(slot))?;
    }
    let tried = slots
        .estimate
        .map(|slot| estimate_tried(chain, answers.get(slot)))
        .transpose()?;
    Ok((facts, tried))
}

/// The wallet as Multicall3 saw it once the factory ran, inside an `eth_call`: a node without
/// state overrides still runs the deployment that way. Only a wallet's code answers with data or
/// reverts (a call to an address without code succeeds with none).
fn read_deployed(
    facts: &mut ChainFacts,
    chain: &Chain,
    answer: &CallResult,
) -> Result<(), Unreachable> {
    let results = match answer {
        Ok(v) => v
            .as_str()
            .and_then(evm::hex_decode)
            .and_then(|bytes| erc6492::decode_results(&bytes)),
        Err(e) if e.is_revert() => None,
        Err(e) => return Err(unreadable(chain, "Multicall3 aggregate3", e.to_string())),
    };
    match results.as_deref() {
        Some([_, (ok, data)]) => {
            facts.wallet_has_code = facts.from_has_code || !ok || !data.is_empty();
            facts.erc1271_valid = Some(*ok && erc1271_accepted(data));
        }
        _ => {
            facts.deployment_unavailable =
                Some("Multicall3 (0xcA11bde05977b3631167028862bE2a173976CA11), through which the settlement deploys it, did not answer on this network")
        }
    }
    Ok(())
}

/// Whether the token took the permit's `eth_call`: a revert refuses it; a node that could not run
/// the call said nothing.
fn permit_accepted(chain: &Chain, answer: &CallResult) -> Result<bool, Unreachable> {
    match answer {
        Ok(_) => Ok(true),
        Err(e) if e.is_revert() => Ok(false),
        Err(e) => Err(unreadable(chain, "the EIP-2612 permit", e.to_string())),
    }
}

/// The settlement transaction as `eth_estimateGas`. At `latest`, as the reads: without a block
/// some nodes (anvil) estimate on a pending block, which first executes every transaction in
/// their pool, once per estimate.
fn estimate_call(trial: &Trial<'_>) -> Call {
    Call::new(
        "eth_estimateGas",
        vec![
            json!({
                "from": evm::hex_bytes(trial.sender),
                "to": evm::hex_bytes(trial.target),
                "data": evm::hex_bytes(trial.calldata),
            }),
            json!("latest"),
        ],
    )
}

/// What the node's estimate says: a revert or a halt (a wallet that burns all the gas) is the
/// call's answer. One it could not run (mid-reorganisation it may be asked about a block it
/// no longer has) is no answer about the payment.
fn estimate_tried(chain: &Chain, answer: &CallResult) -> Result<Tried, Unreachable> {
    match answer {
        Ok(v) => Ok(Tried::Gas(evm::parse_u64(v).unwrap_or(FALLBACK_GAS_LIMIT))),
        Err(e) if e.is_execution_failure() => Ok(Tried::Reverted(e.message.clone())),
        Err(e) => Err(unreadable(chain, "eth_estimateGas", e.to_string())),
    }
}

/// What the lens's trial says: the gas of the whole transaction, or the token's revert.
fn lens_tried(
    chain: &Chain,
    trial: &Trial<'_>,
    tried: Option<&lens::LensTrial>,
) -> Result<Tried, Unreachable> {
    match tried {
        Some(t) if t.succeeded => Ok(Tried::Gas(
            erc3009::intrinsic_gas(trial.calldata)
                .saturating_add(t.gas.min(u64::MAX.into()).as_u64()),
        )),
        Some(t) => Ok(Tried::Reverted(evm::revert_message(&t.revert_data))),
        None => Err(unreadable(
            chain,
            "the settlement's trial",
            "the lens did not try it".into(),
        )),
    }
}

fn unreadable(chain: &Chain, what: &str, detail: String) -> Unreachable {
    Unreachable {
        chain: chain.name.clone(),
        detail: format!("{what}: {detail}"),
    }
}

fn erc1271_accepted(answer: &[u8]) -> bool {
    answer.len() >= 4 && answer[..4] == erc3009::ERC1271_MAGIC
}
