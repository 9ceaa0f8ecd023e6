//! The `exact` instruction rules (`svm.md` section 3, rules 2 to 6): what a payer's transaction
//! may contain for routerd's fee payer to sign it. The fee payer signs a transaction it did not
//! build, so everything it is asked to sign is held to one fixed shape: a compute budget, one
//! `TransferChecked` to the payee's associated token account, and at most memos and wallet
//! assertions after it. The first rule broken is the answer.

use solana_message::compiled_instruction::CompiledInstruction;
use solana_pubkey::Pubkey;

use super::ata::associated_token_address;
use super::programs::{TokenProgram, COMPUTE_BUDGET, LIGHTHOUSE, MEMO};
use super::transaction::PaymentTransaction;

/// `@x402/svm`'s cap on the compute unit price: 5 lamports per compute unit.
pub const MAX_MICRO_LAMPORTS_PER_COMPUTE_UNIT: u64 = 5_000_000;
/// The cluster's base fee for each signature a transaction carries.
pub const LAMPORTS_PER_SIGNATURE: u64 = 5_000;
/// What a system account with no data keeps to be rent-exempt. The runtime refuses a
/// transaction whose fee would leave its fee payer below it (and above zero), so a fee payer
/// needs it beside the fee.
pub const RENT_EXEMPT_MINIMUM: u64 = 890_880;

/// Micro-lamports in a lamport: the compute unit price's unit.
const MICRO_LAMPORTS_PER_LAMPORT: u64 = 1_000_000;
/// The signatures a payment needs: the fee payer's and the transfer authority's. Each one more
/// is a signature fee the fee payer pays.
const NEEDED_SIGNATURES: usize = 2;

/// The most one settlement costs its fee payer: two signatures (the payer's and its own) and
/// the priority fee, the lower of the compute limit at the price cap and the operator's cap on
/// it. Rule 5 keeps it from paying anything else.
pub fn max_settlement_fee(max_compute_units: u32, max_priority_fee_lamports: u64) -> u64 {
    let priority = priority_fee(max_compute_units, MAX_MICRO_LAMPORTS_PER_COMPUTE_UNIT);
    NEEDED_SIGNATURES as u64 * LAMPORTS_PER_SIGNATURE + priority.min(max_priority_fee_lamports)
}

/// What the fee payer pays on top of the signature fees: the compute unit limit times the unit
/// price, in lamports, a micro-lamport remainder counting as a whole lamport (as the runtime
/// rounds it).
fn priority_fee(units: u32, micro_lamports_per_unit: u64) -> u64 {
    let micro = u128::from(units) * u128::from(micro_lamports_per_unit);
    u64::try_from(micro.div_ceil(u128::from(MICRO_LAMPORTS_PER_LAMPORT))).unwrap_or(u64::MAX)
}
/// The compute limit, the price and the transfer come first.
const REQUIRED_INSTRUCTIONS: usize = 3;

const SET_COMPUTE_UNIT_LIMIT: u8 = 2;
const SET_COMPUTE_UNIT_PRICE: u8 = 3;
const TRANSFER_CHECKED: u8 = 12;

/// What the version and the chain allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// 6 in x402 v1, 7 in v2.
    pub max_instructions: usize,
    pub max_compute_units: u32,
    pub max_micro_lamports_per_compute_unit: u64,
    /// `chains.<cluster>.max_priority_fee_lamports`: the most the limit times the price may be.
    pub max_priority_fee_lamports: u64,
}

/// What the payment requirements ask, in Solana's types.
#[derive(Debug, Clone, Copy)]
pub struct Requirements<'a> {
    /// `extra.feePayer`, already known to be one of routerd's keys.
    pub fee_payer: &'a Pubkey,
    /// Every fee payer routerd holds: none of them may authorise the transfer.
    pub fee_payers: &'a [Pubkey],
    pub mint: &'a Pubkey,
    pub pay_to: &'a Pubkey,
    pub amount: u64,
    pub memo: Option<&'a str>,
    pub limits: Limits,
}

/// The one transfer a valid payment makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    pub program: TokenProgram,
    pub source: Pubkey,
    pub mint: Pubkey,
    pub destination: Pubkey,
    /// The payer: the owner (or delegate) whose signature moves the tokens.
    pub authority: Pubkey,
    pub amount: u64,
    pub decimals: u8,
}

/// Why a transaction is refused, one variant per rule; the protocol versions name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a required signature is missing or invalid")]
    SignatureInvalid,
    #[error("address lookup tables are not accepted")]
    LookupTables,
    #[error("the fee payer is not the one the requirements name")]
    FeePayerMismatch,
    #[error("wrong number of instructions")]
    InstructionCount,
    #[error("instruction 0 is not SetComputeUnitLimit")]
    ComputeLimitInstruction,
    #[error("the compute unit limit is above the cap")]
    ComputeLimitTooHigh,
    #[error("instruction 1 is not SetComputeUnitPrice")]
    ComputePriceInstruction,
    #[error("the compute unit price is above the cap")]
    ComputePriceTooHigh,
    #[error("the priority fee (compute unit limit times price) is {lamports} lamports, above the operator's cap of {cap} (max_priority_fee_lamports)")]
    PriorityFeeTooHigh { lamports: u64, cap: u64 },
    #[error("the transaction carries {count} signatures: only the fee payer's and the transfer authority's are accepted")]
    ExcessiveSigners { count: usize },
    #[error("instruction 2 is not a TransferChecked of SPL Token or Token-2022")]
    NoTransferInstruction,
    #[error("instruction {position} is neither Memo nor Lighthouse")]
    UnknownInstruction { position: usize },
    #[error("the transfer moves another mint")]
    MintMismatch,
    #[error("the transfer does not credit the payee's associated token account")]
    RecipientMismatch,
    #[error("the transfer amount is not the required amount")]
    AmountMismatch,
    #[error(
        "a self-payment: the transfer's authority or source is the payee's, so it moves no value"
    )]
    SelfPayment,
    #[error("a fee payer authorises the transfer")]
    AuthorityIsFeePayer,
    #[error("the fee payer is in an instruction's accounts")]
    FeePayerInAccounts,
    #[error("the requirements' memo needs exactly one Memo instruction")]
    MemoCount,
    #[error("the memo differs from the requirements'")]
    MemoMismatch,
}

/// Holds a decoded transaction to the rules, in `svm.md`'s order; the first broken one answers.
pub fn check(tx: &PaymentTransaction, req: &Requirements) -> Result<Transfer, Refusal> {
    if !tx.payer_signatures_valid() {
        return Err(Refusal::SignatureInvalid);
    }
    // Accounts behind a lookup table are unknown without a read: refusing them keeps every
    // rule below local.
    if tx.uses_lookup_tables() {
        return Err(Refusal::LookupTables);
    }
    if tx.fee_payer() != req.fee_payer {
        return Err(Refusal::FeePayerMismatch);
    }
    let instructions = tx.instructions();
    if !(REQUIRED_INSTRUCTIONS..=req.limits.max_instructions).contains(&instructions.len()) {
        return Err(Refusal::InstructionCount);
    }
    let units = compute_limit(tx, &instructions[0], req.limits.max_compute_units)?;
    let price = compute_price(
        tx,
        &instructions[1],
        req.limits.max_micro_lamports_per_compute_unit,
    )?;
    let lamports = priority_fee(units, price);
    if lamports > req.limits.max_priority_fee_lamports {
        return Err(Refusal::PriorityFeeTooHigh {
            lamports,
            cap: req.limits.max_priority_fee_lamports,
        });
    }
    let transfer = transfer_checked(tx, &instructions[2])?;
    // Every signature is one more fee for the fee payer: only the two a payment needs.
    let count = tx.signers().len();
    if count > NEEDED_SIGNATURES {
        return Err(Refusal::ExcessiveSigners { count });
    }
    let optional = &instructions[REQUIRED_INSTRUCTIONS..];
    only_memos_and_assertions(tx, optional)?;
    transfer_matches(&transfer, req)?;
    fee_payer_isolated(tx)?;
    if let Some(memo) = req.memo {
        memo_matches(tx, optional, memo)?;
    }
    Ok(transfer)
}

fn program<'t>(tx: &'t PaymentTransaction, ix: &CompiledInstruction) -> Option<&'t Pubkey> {
    tx.account(ix.program_id_index)
}

fn compute_limit(
    tx: &PaymentTransaction,
    ix: &CompiledInstruction,
    cap: u32,
) -> Result<u32, Refusal> {
    let units = match (program(tx, ix), ix.data.as_slice()) {
        (Some(&COMPUTE_BUDGET), [SET_COMPUTE_UNIT_LIMIT, units @ ..]) => {
            <[u8; 4]>::try_from(units).map(u32::from_le_bytes)
        }
        _ => return Err(Refusal::ComputeLimitInstruction),
    };
    match units {
        Ok(units) if units > cap => Err(Refusal::ComputeLimitTooHigh),
        Ok(units) => Ok(units),
        Err(_) => Err(Refusal::ComputeLimitInstruction),
    }
}

fn compute_price(
    tx: &PaymentTransaction,
    ix: &CompiledInstruction,
    cap: u64,
) -> Result<u64, Refusal> {
    let price = match (program(tx, ix), ix.data.as_slice()) {
        (Some(&COMPUTE_BUDGET), [SET_COMPUTE_UNIT_PRICE, price @ ..]) => {
            <[u8; 8]>::try_from(price).map(u64::from_le_bytes)
        }
        _ => return Err(Refusal::ComputePriceInstruction),
    };
    match price {
        Ok(price) if price > cap => Err(Refusal::ComputePriceTooHigh),
        Ok(price) => Ok(price),
        Err(_) => Err(Refusal::ComputePriceInstruction),
    }
}

/// `TransferChecked`: data `[12, amount: u64 LE, decimals: u8]`, accounts `[source, mint,
/// destination, authority, multisig signers...]`.
fn transfer_checked(
    tx: &PaymentTransaction,
    ix: &CompiledInstruction,
) -> Result<Transfer, Refusal> {
    let program = program(tx, ix).and_then(TokenProgram::from_id);
    let (Some(program), [TRANSFER_CHECKED, amount @ .., decimals]) = (program, ix.data.as_slice())
    else {
        return Err(Refusal::NoTransferInstruction);
    };
    let Ok(amount) = <[u8; 8]>::try_from(amount) else {
        return Err(Refusal::NoTransferInstruction);
    };
    let account = |n: usize| ix.accounts.get(n).and_then(|&i| tx.account(i)).copied();
    let (Some(source), Some(mint), Some(destination), Some(authority)) =
        (account(0), account(1), account(2), account(3))
    else {
        return Err(Refusal::NoTransferInstruction);
    };
    Ok(Transfer {
        program,
        source,
        mint,
        destination,
        authority,
        amount: u64::from_le_bytes(amount),
        decimals: *decimals,
    })
}

/// Where a checked payment's transfer takes from and pays to, as indexes into the message's
/// accounts (instruction 2's first and third accounts): how the transaction's own record, which
/// lists token balances by index, is read for it.
pub fn transfer_indexes(tx: &PaymentTransaction) -> Option<(u8, u8)> {
    let accounts = &tx.instructions().get(2)?.accounts;
    Some((*accounts.first()?, *accounts.get(2)?))
}

fn only_memos_and_assertions(
    tx: &PaymentTransaction,
    optional: &[CompiledInstruction],
) -> Result<(), Refusal> {
    for (i, ix) in optional.iter().enumerate() {
        if !matches!(program(tx, ix), Some(&MEMO) | Some(&LIGHTHOUSE)) {
            return Err(Refusal::UnknownInstruction {
                position: REQUIRED_INSTRUCTIONS + i,
            });
        }
    }
    Ok(())
}

fn transfer_matches(transfer: &Transfer, req: &Requirements) -> Result<(), Refusal> {
    if transfer.mint != *req.mint {
        return Err(Refusal::MintMismatch);
    }
    if transfer.destination != associated_token_address(req.pay_to, req.mint, transfer.program) {
        return Err(Refusal::RecipientMismatch);
    }
    // Tokens that stay with their owner move no value: the fee payer's fee would be all that
    // is spent. The destination's owner, when it is not `payTo` (an account whose owner was
    // reassigned), is read on chain and held to the same rule at verify.
    if transfer.source == transfer.destination || transfer.authority == *req.pay_to {
        return Err(Refusal::SelfPayment);
    }
    if transfer.amount != req.amount {
        return Err(Refusal::AmountMismatch);
    }
    if req.fee_payers.contains(&transfer.authority) {
        return Err(Refusal::AuthorityIsFeePayer);
    }
    Ok(())
}

/// The fee payer signs the whole transaction: an instruction that names it could make it pay
/// rent, fund an account or authorise anything. Naming it nowhere leaves it the fees only.
fn fee_payer_isolated(tx: &PaymentTransaction) -> Result<(), Refusal> {
    let named = tx
        .instructions()
        .iter()
        .flat_map(|ix| &ix.accounts)
        .any(|&i| i == 0);
    if named {
        return Err(Refusal::FeePayerInAccounts);
    }
    Ok(())
}

fn memo_matches(
    tx: &PaymentTransaction,
    optional: &[CompiledInstruction],
    memo: &str,
) -> Result<(), Refusal> {
    let mut memos = optional.iter().filter(|ix| program(tx, ix) == Some(&MEMO));
    let (Some(only), None) = (memos.next(), memos.next()) else {
        return Err(Refusal::MemoCount);
    };
    if only.data != memo.as_bytes() {
        return Err(Refusal::MemoMismatch);
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use base64::engine::general_purpose::STANDARD as BASE64;
    use base64::Engine;
    use solana_keypair::Keypair;
    use solana_message::{v0, AccountMeta, Hash, Instruction, Message, VersionedMessage};
    use solana_signature::Signature;
    use solana_signer::Signer;
    use solana_transaction::versioned::VersionedTransaction;

    use super::*;
    use crate::svm::programs::{TOKEN, TOKEN_2022};

    /// A payer, routerd's fee payer, a mint and a payee: what every test transaction is built from.
    pub(crate) struct Fixture {
        pub fee_payer: Keypair,
        pub payer: Keypair,
        pub mint: Pubkey,
        pub pay_to: Pubkey,
        pub program: TokenProgram,
    }

    pub(crate) const AMOUNT: u64 = 10_000;

    impl Fixture {
        pub fn new() -> Self {
            Self {
                fee_payer: Keypair::new(),
                payer: Keypair::new(),
                mint: Pubkey::new_unique(),
                pay_to: Pubkey::new_unique(),
                program: TokenProgram::Token,
            }
        }

        pub fn source(&self) -> Pubkey {
            associated_token_address(&self.payer.pubkey(), &self.mint, self.program)
        }

        /// Compiles and signs by the payer, leaving the fee payer's slot empty as clients do.
        pub fn build(&self, instructions: Vec<Instruction>, legacy: bool) -> VersionedTransaction {
            let blockhash = Hash::new_from_array([9; 32]);
            let fee_payer = self.fee_payer.pubkey();
            let message = if legacy {
                VersionedMessage::Legacy(Message::new_with_blockhash(
                    &instructions,
                    Some(&fee_payer),
                    &blockhash,
                ))
            } else {
                VersionedMessage::V0(
                    v0::Message::try_compile(&fee_payer, &instructions, &[], blockhash).unwrap(),
                )
            };
            let bytes = message.serialize();
            let keys = message.static_account_keys();
            let signatures = (0..usize::from(message.header().num_required_signatures))
                .map(|i| {
                    if keys[i] == self.payer.pubkey() {
                        self.payer.sign_message(&bytes)
                    } else {
                        Signature::default()
                    }
                })
                .collect();
            VersionedTransaction {
                signatures,
                message,
            }
        }

        pub fn encode(&self, tx: VersionedTransaction) -> String {
            BASE64.encode(bincode::serialize(&tx).unwrap())
        }

        pub fn requirements<'a>(
            &'a self,
            fee_payers: &'a [Pubkey],
            memo: Option<&'a str>,
        ) -> Requirements<'a> {
            Requirements {
                fee_payer: &fee_payers[0],
                fee_payers,
                mint: &self.mint,
                pay_to: &self.pay_to,
                amount: AMOUNT,
                memo,
                limits: Limits {
                    max_instructions: 7,
                    max_compute_units: 400_000,
                    max_micro_lamports_per_compute_unit: MAX_MICRO_LAMPORTS_PER_COMPUTE_UNIT,
                    max_priority_fee_lamports: 10_000,
                },
            }
        }
    }

    pub(crate) fn compute_limit(units: u32) -> Instruction {
        let mut data = vec![SET_COMPUTE_UNIT_LIMIT];
        data.extend(units.to_le_bytes());
        Instruction {
            program_id: COMPUTE_BUDGET,
            accounts: vec![],
            data,
        }
    }

    pub(crate) fn compute_price(micro_lamports: u64) -> Instruction {
        let mut data = vec![SET_COMPUTE_UNIT_PRICE];
        data.extend(micro_lamports.to_le_bytes());
        Instruction {
            program_id: COMPUTE_BUDGET,
            accounts: vec![],
            data,
        }
    }

    pub(crate) fn transfer(
        f: &Fixture,
        destination: Pubkey,
        authority: Pubkey,
        amount: u64,
    ) -> Instruction {
        let mut data = vec![TRANSFER_CHECKED];
        data.extend(amount.to_le_bytes());
        data.push(6);
        Instruction {
            program_id: f.program.id(),
            accounts: vec![
                AccountMeta::new(f.source(), false),
                AccountMeta::new_readonly(f.mint, false),
                AccountMeta::new(destination, false),
                AccountMeta::new_readonly(authority, true),
            ],
            data,
        }
    }

    pub(crate) fn memo(text: &str) -> Instruction {
        Instruction {
            program_id: MEMO,
            accounts: vec![],
            data: text.as_bytes().to_vec(),
        }
    }

    /// The transaction `@x402/svm`'s client builds.
    pub(crate) fn payment(f: &Fixture) -> Vec<Instruction> {
        let destination = associated_token_address(&f.pay_to, &f.mint, f.program);
        vec![
            compute_limit(20_000),
            compute_price(1),
            transfer(f, destination, f.payer.pubkey(), AMOUNT),
        ]
    }

    fn verdict(
        f: &Fixture,
        instructions: Vec<Instruction>,
        memo: Option<&str>,
    ) -> Result<Transfer, Refusal> {
        let tx = PaymentTransaction::decode(&f.encode(f.build(instructions, false))).unwrap();
        check(&tx, &f.requirements(&[f.fee_payer.pubkey()], memo))
    }

    #[test]
    fn the_clients_transaction_passes_in_both_formats_and_token_programs() {
        for program in [TokenProgram::Token, TokenProgram::Token2022] {
            for legacy in [false, true] {
                let f = Fixture {
                    program,
                    ..Fixture::new()
                };
                let tx =
                    PaymentTransaction::decode(&f.encode(f.build(payment(&f), legacy))).unwrap();
                let transfer = check(&tx, &f.requirements(&[f.fee_payer.pubkey()], None)).unwrap();
                assert_eq!(transfer.authority, f.payer.pubkey());
                assert_eq!(transfer.source, f.source());
                let (source, destination) = transfer_indexes(&tx).unwrap();
                assert_eq!(tx.account(source), Some(&transfer.source));
                assert_eq!(tx.account(destination), Some(&transfer.destination));
                assert_eq!(
                    transfer.program.id(),
                    if program == TokenProgram::Token {
                        TOKEN
                    } else {
                        TOKEN_2022
                    }
                );
                assert_eq!((transfer.amount, transfer.decimals), (AMOUNT, 6));
            }
        }
    }

    #[test]
    fn memos_and_assertions_may_follow_up_to_the_versions_count() {
        let f = Fixture::new();
        let lighthouse = Instruction {
            program_id: LIGHTHOUSE,
            accounts: vec![],
            data: vec![1],
        };
        let mut ixs = payment(&f);
        ixs.extend([
            memo("order-1"),
            lighthouse.clone(),
            lighthouse.clone(),
            lighthouse,
        ]);
        assert!(verdict(&f, ixs.clone(), Some("order-1")).is_ok());
        ixs.push(memo("x"));
        assert_eq!(verdict(&f, ixs, None), Err(Refusal::InstructionCount));
        let tx = PaymentTransaction::decode(
            &f.encode(f.build([payment(&f), vec![memo("a"); 4]].concat(), false)),
        )
        .unwrap();
        let fee_payers = [f.fee_payer.pubkey()];
        let mut req = f.requirements(&fee_payers, None);
        req.limits.max_instructions = 6;
        assert_eq!(check(&tx, &req), Err(Refusal::InstructionCount));
    }

    /// The payment with its instruction at `i` replaced by `ix`.
    fn with(f: &Fixture, i: usize, ix: Instruction) -> Vec<Instruction> {
        let mut v = payment(f);
        v[i] = ix;
        v
    }

    /// Each transaction is refused for the reason it is paired with.
    fn refuses_each(f: &Fixture, cases: Vec<(Vec<Instruction>, Option<&str>, Refusal)>) {
        for (ixs, memo, refusal) in cases {
            assert_eq!(verdict(f, ixs, memo), Err(refusal), "{refusal}");
        }
    }

    #[test]
    fn each_compute_budget_rule_refuses_its_transaction() {
        let f = Fixture::new();
        refuses_each(
            &f,
            vec![
                (payment(&f)[..2].to_vec(), None, Refusal::InstructionCount),
                (
                    with(&f, 0, compute_price(1)),
                    None,
                    Refusal::ComputeLimitInstruction,
                ),
                (
                    with(&f, 0, compute_limit(400_001)),
                    None,
                    Refusal::ComputeLimitTooHigh,
                ),
                (
                    with(&f, 1, compute_limit(1)),
                    None,
                    Refusal::ComputePriceInstruction,
                ),
                (
                    with(&f, 1, compute_price(5_000_001)),
                    None,
                    Refusal::ComputePriceTooHigh,
                ),
            ],
        );
    }

    #[test]
    fn each_transfer_rule_refuses_its_transaction() {
        let f = Fixture::new();
        let ata = associated_token_address(&f.pay_to, &f.mint, f.program);
        let me = f.payer.pubkey();
        refuses_each(
            &f,
            vec![
                (
                    with(&f, 2, memo("not a transfer")),
                    None,
                    Refusal::NoTransferInstruction,
                ),
                (
                    [payment(&f), vec![compute_limit(1)]].concat(),
                    None,
                    Refusal::UnknownInstruction { position: 3 },
                ),
                (
                    with(&f, 2, transfer(&f, Pubkey::new_unique(), me, AMOUNT)),
                    None,
                    Refusal::RecipientMismatch,
                ),
                (
                    with(&f, 2, transfer(&f, ata, me, AMOUNT + 1)),
                    None,
                    Refusal::AmountMismatch,
                ),
                (
                    with(&f, 2, transfer(&f, ata, f.fee_payer.pubkey(), AMOUNT)),
                    None,
                    Refusal::AuthorityIsFeePayer,
                ),
            ],
        );
    }

    #[test]
    fn each_fee_payer_and_memo_rule_refuses_its_transaction() {
        let f = Fixture::new();
        refuses_each(
            &f,
            vec![
                (
                    [
                        payment(&f),
                        vec![Instruction {
                            accounts: vec![AccountMeta::new(f.fee_payer.pubkey(), true)],
                            ..memo("m")
                        }],
                    ]
                    .concat(),
                    None,
                    Refusal::FeePayerInAccounts,
                ),
                (payment(&f), Some("order-1"), Refusal::MemoCount),
                (
                    [payment(&f), vec![memo("order-1"), memo("order-1")]].concat(),
                    Some("order-1"),
                    Refusal::MemoCount,
                ),
                (
                    [payment(&f), vec![memo("order-2")]].concat(),
                    Some("order-1"),
                    Refusal::MemoMismatch,
                ),
            ],
        );
    }

    #[test]
    fn a_transfer_of_another_mint_is_refused() {
        let f = Fixture::new();
        let other = Fixture {
            mint: Pubkey::new_unique(),
            ..Fixture::new()
        };
        let tx = PaymentTransaction::decode(&f.encode(f.build(payment(&f), false))).unwrap();
        let fee_payers = [f.fee_payer.pubkey()];
        let req = Requirements {
            mint: &other.mint,
            ..f.requirements(&fee_payers, None)
        };
        assert_eq!(check(&tx, &req), Err(Refusal::MintMismatch));
    }

    #[test]
    fn the_fee_payer_must_be_the_named_one_and_signatures_valid() {
        let f = Fixture::new();
        let tx = PaymentTransaction::decode(&f.encode(f.build(payment(&f), false))).unwrap();
        let ours = [Pubkey::new_unique(), f.fee_payer.pubkey()];
        assert_eq!(
            check(&tx, &f.requirements(&ours, None)),
            Err(Refusal::FeePayerMismatch)
        );
        let mut forged = f.build(payment(&f), false);
        forged.signatures[1] = Signature::from([1; 64]);
        let forged = PaymentTransaction::decode(&f.encode(forged)).unwrap();
        assert_eq!(
            check(&forged, &f.requirements(&[f.fee_payer.pubkey()], None)),
            Err(Refusal::SignatureInvalid)
        );
    }

    #[test]
    fn a_settlement_costs_at_most_two_signatures_and_the_capped_priority_fee() {
        // 400,000 compute units at 5 lamports each, and 2 x 5,000 for the signatures.
        assert_eq!(max_settlement_fee(400_000, u64::MAX), 2_010_000);
        // The operator's cap binds below the price cap.
        assert_eq!(max_settlement_fee(40_000, 10_000), 20_000);
        // A micro-lamport remainder still costs a whole lamport.
        assert_eq!(max_settlement_fee(1, 10_000), 10_005);
        assert_eq!(priority_fee(u32::MAX, u64::MAX), u64::MAX);
    }

    #[test]
    fn the_priority_fee_is_held_to_the_operators_cap() {
        let f = Fixture::new();
        let with_budget = |units, price| {
            let mut v = payment(&f);
            v[0] = compute_limit(units);
            v[1] = compute_price(price);
            v
        };
        // 20,000 units at 500,000 micro-lamports: exactly the 10,000 lamports allowed.
        assert!(verdict(&f, with_budget(20_000, 500_000), None).is_ok());
        assert_eq!(
            verdict(&f, with_budget(20_000, 500_001), None),
            Err(Refusal::PriorityFeeTooHigh {
                lamports: 10_001,
                cap: 10_000
            })
        );
        // The 400,000 units at 5 lamports each, within the fixture's compute cap.
        assert_eq!(
            verdict(&f, with_budget(400_000, 5_000_000), None),
            Err(Refusal::PriorityFeeTooHigh {
                lamports: 2_000_000,
                cap: 10_000
            })
        );
    }

    #[test]
    fn a_signature_beyond_the_fee_payers_and_the_authoritys_is_refused() {
        let f = Fixture::new();
        let extra = Keypair::new();
        let ixs = [
            payment(&f),
            vec![Instruction {
                accounts: vec![AccountMeta::new_readonly(extra.pubkey(), true)],
                ..memo("m")
            }],
        ]
        .concat();
        let mut tx = f.build(ixs, false);
        let bytes = tx.message.serialize();
        let at = tx
            .message
            .static_account_keys()
            .iter()
            .position(|k| *k == extra.pubkey());
        tx.signatures[at.unwrap()] = extra.sign_message(&bytes);
        let tx = PaymentTransaction::decode(&f.encode(tx)).unwrap();
        assert_eq!(
            check(&tx, &f.requirements(&[f.fee_payer.pubkey()], None)),
            Err(Refusal::ExcessiveSigners { count: 3 })
        );
    }

    #[test]
    fn a_payment_to_its_own_payer_is_a_self_payment() {
        let f = Fixture::new();
        // payTo is the payer: the destination is the source.
        let own = Fixture {
            pay_to: f.payer.pubkey(),
            ..f
        };
        assert_eq!(
            verdict(&own, payment(&own), None),
            Err(Refusal::SelfPayment)
        );
    }
}
