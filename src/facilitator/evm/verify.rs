//! The verify rules of x402-facilitator.md §2 from rule 6 on, in order, on a request whose rules
//! 1-5 passed when its version lowered it (`protocol`): the deny list and cooldown, then one
//! batched read of the chain (`read`), then the chain-dependent rules. First failure wins.

mod read;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use ethers_core::types::{Address, H256, U256};

use super::ledger_nonce::nonce_read;
use super::request::{Method, Request, Served, Through, TokenInfo};
use crate::chain::{Chain, Unreachable};
use crate::clock::unix_now;
use crate::evm;
use crate::evm::batch;
use crate::evm::erc3009::{self, TransferAuthorization};
use crate::evm::erc6492::{self, Deployment};
use crate::evm::permit2::{self, Eip2612Permit, Permit2Authorization};
use crate::evm::NonceRead;
use crate::facilitator::deny_list::DenyLists;
use crate::facilitator::outcome::{Invalid, Message};
use crate::facilitator::settlement::cooldown::Cooldown;
use crate::ledger::Reason;
use crate::ledger::{self, PaymentKey};
use crate::store::StoreError;
use read::{read_chain, ChainFacts};
pub use read::{Payer, Trial, Tried};

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
    /// The call that executes the authorization, when it is not the token's own.
    pub through: Option<Through>,
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
        nonce_read(method, self.token.address, self.auth.from, self.auth.nonce)
    }

    /// The idempotency key of x402-facilitator.md §3: (network, asset, from, nonce).
    pub fn key(&self) -> PaymentKey {
        let network = self.network.name.clone();
        PaymentKey::evm(network, self.token.address, self.auth.from, self.auth.nonce)
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

/// What the payer signed, as `method` says.
fn signed_digest(
    network: &Network,
    token: &TokenInfo,
    auth: &TransferAuthorization,
    method: Method,
) -> H256 {
    match method {
        Method::Eip3009 => erc3009::digest(token.domain_separator, auth),
        Method::Eip3009Receive => erc3009::receive_digest(token.domain_separator, auth),
        Method::Permit2Deposit { channel } => batch::Permit2Deposit {
            token: token.address,
            amount: auth.value,
            spender: auth.to,
            nonce: U256::from_big_endian(auth.nonce.as_bytes()),
            deadline: auth.valid_before,
            channel,
        }
        .digest(network.permit2_domain),
        Method::Permit2 | Method::Permit2Upto { .. } => permit2::digest(
            network.permit2_domain,
            &permit2_authorization(auth, token.address, method),
        ),
    }
}

pub struct Verifier {
    networks: HashMap<String, Network>,
    /// `facilitator.deny_list_file`, as last read.
    deny_list: Arc<DenyLists>,
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
        deny_list: Arc<DenyLists>,
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
        Ok(
            match self
                .cooldown
                .refuses_stored(&ledger::Payer::Evm(payer))
                .await?
            {
                Some(left) => Err(cooled_down(left)),
                None => Ok(()),
            },
        )
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
        if self.deny_list.denies_evm(&auth.from) {
            return Err(invalid(Reason::FromKyt, "payer is on the deny list"));
        }
        if let Some(left) = self.cooldown.refuses(&ledger::Payer::Evm(auth.from)) {
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
        let digest = signed_digest(network, token, &auth, request.method);
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
            through: request.through.clone(),
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
        if self.deny_list.denies_evm(&payment.pay_to) || facts.to_blacklisted {
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
