//! The verify rules of x402-facilitator.md §2 from rule 6 on, in order, on a request whose rules
//! 1-5 passed when its version lowered it (`protocol`): the deny list and cooldown, then one
//! batched read of the chain, then the chain-dependent rules. First failure wins.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use ethers_core::types::{Address, Bytes, H256, U256};
use serde_json::{json, Value};

use super::lens;
use super::request::{Method, Request, Served, TokenInfo};
use crate::chain::Traffic;
use crate::chain::{self, Batch, Call, CallResult, Chain, ReadMode, Slot, Unreachable};
use crate::clock::unix_now;
use crate::evm;
use crate::evm::erc3009::{self, TransferAuthorization};
use crate::evm::erc6492::{self, Deployment};
use crate::evm::permit2::{self, Eip2612Permit, Permit2Authorization};
use crate::evm::NonceRead;
use crate::facilitator::outcome::{Invalid, Message};
use crate::facilitator::settlement::cooldown::Cooldown;
use crate::ledger::PaymentKey;
use crate::ledger::Reason;
use crate::store::StoreError;

/// A served network: its chain and the ERC-3009 tokens the facilitator may call there.
pub struct Network {
    pub name: String,
    pub chain: Arc<Chain>,
    pub tokens: Vec<TokenInfo>,
    /// Permit2's EIP-712 domain separator on this chain; computed once, as each token's is.
    pub permit2_domain: H256,
    /// Where a settlement's gas comes from here; learnt from the first settlement tried both
    /// ways (see [`SettleGas`]).
    pub settle_gas: OnceLock<SettleGas>,
}

/// Where a settlement's gas limit comes from, on a chain whose node runs the lens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleGas {
    /// The lens's trial: the gas the call took, plus the transaction's intrinsic gas. One
    /// execution on the node instead of an estimate's several.
    Trial,
    /// `eth_estimateGas`: on a chain that charges for more than execution in gas (Arbitrum
    /// folds its L1 share into the gas limit), the node's estimate is far above the trial.
    Estimate,
}

impl SettleGas {
    /// From one settlement tried both ways: the trial holds when the node's estimate is not
    /// above it by more than 5%. (The trial pays for the token's account cold, which the
    /// transaction does not; an estimate can exceed the gas used by the 1/64 that each nested
    /// call must leave behind.)
    fn of(tried: u64, estimated: u64) -> Self {
        match estimated <= tried + tried / 20 {
            true => SettleGas::Trial,
            false => SettleGas::Estimate,
        }
    }
}

impl Network {
    fn learn_settle_gas(&self, tried: u64, estimated: u64) {
        let source = SettleGas::of(tried, estimated);
        if self.settle_gas.set(source).is_ok() {
            tracing::info!(network = %self.name, tried, estimated, source = ?source, "settlement gas source");
        }
    }
}

fn invalid(reason: Reason, message: impl Into<Message>) -> Invalid {
    Invalid::new(reason, message)
}

/// Rule 6's refusal of a payer in its revert cooldown.
fn cooled_down(left: u64) -> Invalid {
    invalid(
        Reason::FromKyt,
        format!("payer is refused for {left} s more: a settlement of theirs reverted on chain (facilitator.revert_cooldown_secs)"),
    )
}

/// A payment whose values all parse and whose requirements match the configuration.
pub struct Payment<'a> {
    pub network: &'a Network,
    pub token: &'a TokenInfo,
    /// What the payer signed; a Permit2 authorization in the same terms.
    pub auth: TransferAuthorization,
    pub method: Method,
    /// The payer's EIP-2612 approval of Permit2, submitted first by the settlement.
    pub eip2612: Option<Eip2612Permit>,
    pub pay_to: Address,
    pub max_amount: U256,
    /// The signature the token checks: an ERC-6492 wrapper's inner signature.
    pub signature: Vec<u8>,
    pub digest: H256,
    /// Who signed, for a 65-byte signature the token's ECDSA path accepts; recovered once.
    pub recovered: Option<Address>,
    /// What deploys the payer's wallet, when the signature was ERC-6492 wrapped.
    pub counterfactual: Counterfactual,
}

/// What an ERC-6492 wrapper asks the facilitator to deploy first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counterfactual {
    /// Not wrapped, or wrapped with no factory: the wallet exists or `from` is an EOA.
    No,
    /// Through a factory on `facilitator.erc6492_factories`.
    Deploys(Deployment),
    /// Through a factory that is not on it: nothing calls it.
    FactoryRefused(Address),
}

impl Counterfactual {
    pub fn deployment(&self) -> Option<&Deployment> {
        match self {
            Counterfactual::Deploys(deployment) => Some(deployment),
            _ => None,
        }
    }
}

impl Payment<'_> {
    /// The Permit2 authorization this payment's terms came from (for a Permit2 payment).
    pub fn permit2(&self) -> Permit2Authorization {
        permit2_authorization(&self.auth, self.token.address, self.method)
    }

    /// What the settlement moves: the authorization's value, or for `upto` what the
    /// requirements charge (at most the permitted amount, rule 9).
    pub fn charge(&self) -> U256 {
        match self.method {
            Method::Permit2Upto { .. } => self.max_amount,
            _ => self.auth.value,
        }
    }

    /// Where this payment's nonce is marked used.
    pub fn nonce_read(&self) -> NonceRead {
        let method = self.method.transfer_method();
        method.nonce_read(self.token.address, self.auth.from, self.auth.nonce)
    }

    /// The idempotency key of x402-facilitator.md §3: (network, asset, from, nonce).
    pub fn key(&self) -> PaymentKey {
        PaymentKey {
            network: self.network.name.clone(),
            asset: self.token.address,
            from: self.auth.from,
            nonce: self.auth.nonce,
        }
    }
}

/// The Permit2 authorization `auth`'s terms came from, for a Permit2 payment of `token`.
fn permit2_authorization(
    auth: &TransferAuthorization,
    token: Address,
    method: Method,
) -> Permit2Authorization {
    Permit2Authorization {
        from: auth.from,
        token,
        amount: auth.value,
        spender: match method {
            Method::Permit2Upto { .. } => permit2::UPTO_PROXY,
            _ => permit2::EXACT_PROXY,
        },
        nonce: U256::from_big_endian(auth.nonce.as_bytes()),
        deadline: auth.valid_before,
        to: auth.to,
        valid_after: auth.valid_after,
        facilitator: match method {
            Method::Permit2Upto { facilitator } => Some(facilitator),
            _ => None,
        },
    }
}

/// What the chain says about a payment, read in one batch.
#[derive(Debug, Clone)]
struct ChainFacts {
    from_has_code: bool,
    balance: U256,
    authorization_used: bool,
    /// The payer's approval of Permit2, for a Permit2 payment.
    permit2_allowance: Option<U256>,
    from_blacklisted: bool,
    to_blacklisted: bool,
    /// After the ERC-6492 deployment asked, inside the read only.
    wallet_has_code: bool,
    /// Why the read could not run the deployment asked, when it could not.
    deployment_unavailable: Option<&'static str>,
    /// `Some` when ERC-1271 was asked: the signature did not recover to `from` locally.
    erc1271_valid: Option<bool>,
    /// `Some` when the payment carries an EIP-2612 permit: whether the token takes it.
    eip2612_accepted: Option<bool>,
    block_timestamp: u64,
}

pub struct Verifier {
    networks: HashMap<String, Network>,
    deny_list: HashSet<Address>,
    /// Payers refused for a while after a settlement of theirs reverted (rule 6).
    cooldown: Arc<Cooldown>,
    /// `facilitator.allow_http_resource`: rule 4 also accepts `http://` resources.
    allow_http_resource: bool,
    /// `facilitator.max_signature_bytes`: longer signatures fail rule 5.
    max_signature_bytes: usize,
    /// `facilitator.erc6492_factories`: the factories a settlement may call.
    erc6492_factories: HashSet<Address>,
    /// The signers' addresses: an `upto` witness must name one.
    signers: HashSet<Address>,
}

impl Verifier {
    pub fn new(
        networks: Vec<Network>,
        deny_list: HashSet<Address>,
        cooldown: Arc<Cooldown>,
        max_signature_bytes: usize,
    ) -> Self {
        Self {
            networks: networks.into_iter().map(|n| (n.name.clone(), n)).collect(),
            deny_list,
            cooldown,
            allow_http_resource: false,
            max_signature_bytes,
            erc6492_factories: HashSet::new(),
            signers: HashSet::new(),
        }
    }

    pub fn signers(mut self, signers: HashSet<Address>) -> Self {
        self.signers = signers;
        self
    }

    pub fn allow_http_resource(mut self, allow: bool) -> Self {
        self.allow_http_resource = allow;
        self
    }

    pub fn erc6492_factories(mut self, factories: HashSet<Address>) -> Self {
        self.erc6492_factories = factories;
        self
    }

    pub fn networks(&self) -> impl Iterator<Item = &Network> {
        self.networks.values()
    }

    /// The served network of that name.
    pub fn network(&self, name: &str) -> Option<&Network> {
        self.networks.get(name)
    }

    /// The revert cooldown asked again of a shared store, for settle: another instance may have
    /// imposed it since this one last read them (verify trusts the copy in memory).
    pub async fn check_cooldown_stored(
        &self,
        payer: Address,
    ) -> Result<Result<(), Invalid>, StoreError> {
        Ok(match self.cooldown.refuses_stored(payer).await? {
            Some(left) => Err(cooled_down(left)),
            None => Ok(()),
        })
    }

    /// Rule 6's local half (the configured deny list and the revert cooldown for `from`): the
    /// payment as the chain rules and the settlement read it.
    pub fn check_local<'a>(&'a self, request: &Request) -> Result<Payment<'a>, Invalid> {
        // The request was lowered against this verifier (`Served`), so both are found.
        let network = self.networks.get(&request.network).ok_or_else(|| {
            invalid(
                Reason::Network,
                format!("network {:?} is not served", request.network),
            )
        })?;
        let token = network
            .tokens
            .iter()
            .find(|t| t.address == request.asset)
            .ok_or_else(|| {
                invalid(
                    Reason::PaymentRequirements,
                    "asset: not a token this facilitator settles on that network",
                )
            })?;
        let auth = request.authorization.clone();
        if self.deny_list.contains(&auth.from) {
            return Err(invalid(Reason::FromKyt, "payer is on the deny list"));
        }
        if let Some(left) = self.cooldown.refuses(auth.from) {
            return Err(cooled_down(left));
        }
        // The payer paying itself: nothing moves but the facilitator's gas. Named as the
        // recipient rule is (`authorization.to` is not payTo): the payee is the wrong one.
        if auth.from == request.pay_to {
            return Err(invalid(Reason::TypedDataMessage, Message::SelfPayment));
        }
        let (signature, counterfactual) = self.unwrap_erc6492(&request.signature)?;
        if let Method::Permit2Upto { facilitator } = request.method {
            if !self.signers.contains(&facilitator) {
                return Err(invalid(
                    Reason::UptoFacilitator,
                    "permit2Authorization.witness.facilitator is not one of this facilitator's signers (GET /supported)",
                ));
            }
            // A deployment goes in one transaction with the settlement, through Multicall3: the
            // upto proxy takes its settlement only from the facilitator itself.
            if counterfactual.deployment().is_some() {
                return Err(invalid(
                    Reason::Payload,
                    "signature: an upto payment is settled only by a transaction of its facilitator straight to the upto proxy, which cannot carry the ERC-6492 deployment the signature is wrapped with (sign with the wallet deployed, unwrapped)",
                ));
            }
        }
        let digest = match request.method {
            Method::Eip3009 => erc3009::digest(token.domain_separator, &auth),
            Method::Permit2 | Method::Permit2Upto { .. } => permit2::digest(
                network.permit2_domain,
                &permit2_authorization(&auth, token.address, request.method),
            ),
        };
        Ok(Payment {
            network,
            token,
            method: request.method,
            eip2612: request.eip2612.clone(),
            pay_to: request.pay_to,
            max_amount: request.amount,
            recovered: erc3009::recover(digest, &signature),
            digest,
            signature,
            auth,
            counterfactual,
        })
    }

    /// The signature the token checks, and what deploys the wallet first (ERC-6492).
    fn unwrap_erc6492(&self, signature: &[u8]) -> Result<(Vec<u8>, Counterfactual), Invalid> {
        let wrapped = erc6492::unwrap(signature).map_err(|_| {
            invalid(
                Reason::Signature,
                "signature ends with the ERC-6492 suffix but does not wrap (factory, calldata, signature)",
            )
        })?;
        let Some(wrapped) = wrapped else {
            return Ok((signature.to_vec(), Counterfactual::No));
        };
        let counterfactual = match wrapped.deployment {
            None => Counterfactual::No,
            Some(d) if self.erc6492_factories.contains(&d.factory) => Counterfactual::Deploys(d),
            Some(d) => Counterfactual::FactoryRefused(d.factory),
        };
        Ok((wrapped.inner, counterfactual))
    }

    /// One read of the chain, then rules 6-16 in order.
    pub async fn check_on_chain(
        &self,
        payment: &Payment<'_>,
    ) -> Result<Result<(), Invalid>, Unreachable> {
        let (facts, _) = read_chain(payment, None).await?;
        Ok(self.judge(payment, &facts))
    }

    /// [`Self::check_on_chain`], with the settlement transaction tried in the same request;
    /// also the payer as that read saw it.
    pub async fn check_and_try(
        &self,
        payment: &Payment<'_>,
        trial: &Trial<'_>,
    ) -> Result<(Result<(), Invalid>, Tried, Payer), Unreachable> {
        let (facts, tried) = read_chain(payment, Some(trial)).await?;
        let tried = tried.expect("read_chain tries what it is given");
        let payer = Payer {
            balance: facts.balance,
            is_contract: facts.wallet_has_code,
            permit2_allowance: facts.permit2_allowance,
        };
        Ok((self.judge(payment, &facts), tried, payer))
    }

    fn judge(&self, payment: &Payment<'_>, facts: &ChainFacts) -> Result<(), Invalid> {
        let auth = &payment.auth;
        if facts.from_blacklisted {
            return Err(invalid(
                Reason::FromKyt,
                "payer is blacklisted by the token",
            ));
        }
        if self.deny_list.contains(&payment.pay_to) || facts.to_blacklisted {
            return Err(invalid(
                Reason::ToKyt,
                "recipient is on the deny list or blacklisted by the token",
            ));
        }
        check_terms(payment)?;
        let now = unix_now().max(facts.block_timestamp);
        if auth.valid_after > U256::from(now) {
            return Err(invalid(
                Reason::ValidAfter,
                "authorization.validAfter is in the future",
            ));
        }
        let margin = payment.network.chain.settings.valid_before_margin_secs;
        if auth.valid_before < U256::from(now + margin) {
            return Err(invalid(
                Reason::ValidBefore,
                format!("authorization.validBefore is less than {margin}s away"),
            ));
        }
        check_signature(payment, facts)?;
        if facts.authorization_used {
            return Err(invalid(Reason::Payload, "authorization nonce already used"));
        }
        if let Some(permit) = &payment.eip2612 {
            if permit.deadline < U256::from(now + margin) {
                return Err(invalid(
                    Reason::Eip2612Deadline,
                    format!("the EIP-2612 permit's deadline is less than {margin}s away"),
                ));
            }
        }
        check_approval(payment, facts)?;
        if facts.balance < payment.charge() {
            return Err(invalid(
                Reason::InsufficientFunds,
                "payer balance is below authorization.value",
            ));
        }
        Ok(())
    }
}

/// The configuration the versions lower their requests against.
impl Served for Verifier {
    fn tokens(&self, network: &str) -> Option<&[TokenInfo]> {
        self.networks.get(network).map(|n| n.tokens.as_slice())
    }

    fn allow_http_resource(&self) -> bool {
        self.allow_http_resource
    }

    fn max_signature_bytes(&self) -> usize {
        self.max_signature_bytes
    }
}

/// Rules 8-10: the authorization pays what the requirements ask, to whom they ask. Also the test
/// a replay must pass to be told a stored settlement's outcome.
pub fn check_terms(payment: &Payment<'_>) -> Result<(), Invalid> {
    let auth = &payment.auth;
    if auth.to != payment.pay_to {
        return Err(invalid(Reason::TypedDataMessage, Message::ToIsNotPayTo));
    }
    if let Method::Permit2Upto { .. } = payment.method {
        // `upto`: the requirements charge at most what was permitted.
        return match auth.value < payment.max_amount {
            true => Err(invalid(
                Reason::UptoOverPermit,
                "the amount charged exceeds permit2Authorization.permitted.amount",
            )),
            false => Ok(()),
        };
    }
    if auth.value < payment.max_amount {
        return Err(invalid(Reason::ValueTooLow, Message::ValueBelowAmount));
    }
    if auth.value > payment.max_amount {
        return Err(invalid(Reason::Value, Message::ValueAboveAmount));
    }
    Ok(())
}

/// Verify only: an `upto` permit permits exactly the requirements' amount, the most the payer
/// may be charged (`@x402/evm` checks the same). At settle the requirements' amount is the
/// charge, which may be less (`check_terms`).
pub fn check_upto_maximum(payment: &Payment<'_>) -> Result<(), Invalid> {
    match payment.method {
        Method::Permit2Upto { .. } if payment.auth.value != payment.max_amount => Err(invalid(
            Reason::UptoPermitAmount,
            "permit2Authorization.permitted.amount is not paymentRequirements.amount (the maximum)",
        )),
        _ => Ok(()),
    }
}

/// A Permit2 payment's funds move only if Permit2 may spend them: the payer approved it for the
/// amount, or the EIP-2612 permit the settlement submits first (its value is the amount) is one
/// the token takes. The proxy goes on when the permit fails (somebody may have submitted it
/// already), so a refused permit with the allowance short is a settlement that reverts.
fn check_approval(payment: &Payment<'_>, facts: &ChainFacts) -> Result<(), Invalid> {
    let Some(allowance) = facts.permit2_allowance else {
        return Ok(());
    };
    if allowance >= payment.auth.value || facts.eip2612_accepted == Some(true) {
        return Ok(());
    }
    Err(invalid(
        Reason::Permit2Allowance,
        match facts.eip2612_accepted {
            Some(_) => "the token refuses the payment's EIP-2612 permit (paymentPayload.extensions.eip2612GasSponsoring: signature, nonce or deadline), and the payer has not approved Permit2 for the amount",
            None => "the payer has not approved Permit2 for the amount (approve Permit2 on the token once)",
        },
    ))
}

/// Rules 12-14: an EOA must have signed with a well-formed 65-byte signature; a contract wallet
/// must accept it through ERC-1271, once deployed when the signature is ERC-6492 wrapped.
fn check_signature(payment: &Payment<'_>, facts: &ChainFacts) -> Result<(), Invalid> {
    if !facts.from_has_code {
        check_deployment(&payment.counterfactual, facts)?;
    }
    if facts.wallet_has_code {
        return match facts.erc1271_valid {
            Some(false) => Err(invalid(
                Reason::Signature,
                "smart wallet rejected the signature (ERC-1271)",
            )),
            _ => Ok(()),
        };
    }
    match payment.recovered {
        None => Err(invalid(
            Reason::Signature,
            "signature is not a valid 65-byte ECDSA signature",
        )),
        Some(signer) if signer != payment.auth.from => Err(invalid(
            Reason::SignatureAddress,
            "signature was made by another address",
        )),
        Some(_) => Ok(()),
    }
}

/// A wallet not deployed yet is deployed only through an allowed factory, and the read must
/// have tried that deployment and found `from` deployed by it.
fn check_deployment(counterfactual: &Counterfactual, facts: &ChainFacts) -> Result<(), Invalid> {
    match counterfactual {
        Counterfactual::No => Ok(()),
        Counterfactual::FactoryRefused(factory) => Err(invalid(
            Reason::Erc6492Factory,
            format!(
                "signature: ERC-6492 factory {} is not on facilitator.erc6492_factories",
                evm::hex_bytes(factory)
            ),
        )),
        Counterfactual::Deploys(_) if facts.deployment_unavailable.is_some() => Err(invalid(
            Reason::Payload,
            format!(
                "signature: a wallet not yet deployed (ERC-6492) cannot be checked here: {}",
                facts.deployment_unavailable.unwrap_or_default()
            ),
        )),
        Counterfactual::Deploys(_) if !facts.wallet_has_code => Err(invalid(
            Reason::Signature,
            "signature: the ERC-6492 factory call does not deploy authorization.from",
        )),
        Counterfactual::Deploys(_) => Ok(()),
    }
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
async fn read_chain(
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
    let tried = match (by_lens, by_estimate) {
        (Some(Tried::Gas(tried)), Some(Tried::Gas(estimated))) => {
            network.learn_settle_gas(tried, estimated);
            Some(Tried::Gas(tried.max(estimated)))
        }
        (Some(Tried::Reverted(reason)), _) | (_, Some(Tried::Reverted(reason))) => {
            Some(Tried::Reverted(reason))
        }
        (by_lens, by_estimate) => by_lens.or(by_estimate),
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(deployment_ran: bool, wallet_has_code: bool) -> ChainFacts {
        ChainFacts {
            from_has_code: false,
            wallet_has_code,
            deployment_unavailable: (!deployment_ran).then_some("no state overrides"),
            balance: U256::zero(),
            authorization_used: false,
            permit2_allowance: None,
            from_blacklisted: false,
            to_blacklisted: false,
            erc1271_valid: None,
            eip2612_accepted: None,
            block_timestamp: 0,
        }
    }

    #[test]
    fn a_wallet_not_deployed_yet_is_deployed_only_by_an_allowed_factory_that_deploys_it() {
        let deploys = Counterfactual::Deploys(Deployment {
            factory: Address::repeat_byte(0x5d),
            calldata: vec![1].into(),
        });
        assert_eq!(check_deployment(&deploys, &facts(true, true)), Ok(()));
        assert_eq!(
            check_deployment(&Counterfactual::No, &facts(false, false)),
            Ok(())
        );
        let reason =
            |c: &Counterfactual, f: ChainFacts| check_deployment(c, &f).unwrap_err().reason;
        let refused = Counterfactual::FactoryRefused(Address::repeat_byte(0x66));
        assert_eq!(reason(&refused, facts(true, false)), Reason::Erc6492Factory);
        // The factory ran and `from` still has no code: it deploys some other wallet.
        assert_eq!(reason(&deploys, facts(true, false)), Reason::Signature);
        // The read could not run the deployment.
        assert_eq!(reason(&deploys, facts(false, false)), Reason::Payload);
    }

    #[test]
    fn the_trial_gives_the_gas_unless_the_estimate_is_well_above_it() {
        // Measured on anvil with Circle's USDC (facilitator-settle's first settlement).
        assert_eq!(SettleGas::of(98_500, 95_629), SettleGas::Trial);
        assert_eq!(SettleGas::of(80_000, 84_000), SettleGas::Trial);
        assert_eq!(SettleGas::of(80_000, 84_001), SettleGas::Estimate);
        // A chain that puts its L1 share in the gas limit.
        assert_eq!(SettleGas::of(80_000, 400_000), SettleGas::Estimate);
    }
}
