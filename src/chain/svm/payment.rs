//! What verify and settle read of a payment, in one call: `simulateTransaction` with its
//! `accounts` option answers the payment's token accounts and mint as the transfer leaves them,
//! and the state before follows from the amount (the rules let no other instruction touch them).
//! A failed simulation answers no accounts (a node writes `null` for each): only then are they
//! read as they stand (`getMultipleAccounts`), so that a refusal names its reason as it did; the
//! second call costs a refused payment only.

use serde_json::{json, Value};

use super::{mint_refusal, token_account, Delegation, PaymentState, SolanaError, TokenAccount};
use crate::chain::client::{Call, CallResult};
use crate::svm::Pubkey;

/// The accounts of one payment's transfer, and its amount.
#[derive(Debug, Clone, Copy)]
pub struct PaymentAccounts<'a> {
    pub source: &'a Pubkey,
    pub destination: &'a Pubkey,
    pub mint: &'a Pubkey,
    pub amount: u64,
    /// Who signs the transfer: the source's owner or its delegate.
    pub authority: &'a Pubkey,
}

impl PaymentAccounts<'_> {
    fn addresses(&self) -> Value {
        json!([
            self.source.to_string(),
            self.destination.to_string(),
            self.mint.to_string()
        ])
    }
}

/// What a simulation answered.
#[derive(Debug)]
pub(super) enum Simulated {
    /// It ran, and the accounts it left are read back to their state before it.
    Read(Box<PaymentState>),
    /// It failed (its error), or the node did not answer the accounts: they are read apart.
    ReadApart(Option<String>),
}

/// `simulateTransaction` of `wire` (base64) at `commitment`, answering the payment's accounts.
pub(super) fn simulate_call(payment: &PaymentAccounts, wire: &str, commitment: &str) -> Call {
    // Signatures were checked locally; the fee payer's slot may still be empty.
    let config = json!({
        "encoding": "base64", "sigVerify": false, "replaceRecentBlockhash": false,
        "commitment": commitment,
        "accounts": {"encoding": "base64", "addresses": payment.addresses()},
    });
    Call::new("simulateTransaction", vec![json!(wire), config])
}

/// `getMultipleAccounts` of the payment's accounts at `commitment`.
pub(super) fn accounts_call(payment: &PaymentAccounts, commitment: &str) -> Call {
    let config = json!({"encoding": "base64", "commitment": commitment});
    Call::new("getMultipleAccounts", vec![payment.addresses(), config])
}

/// The simulation's answer, read.
pub(super) fn read_simulation(
    answer: CallResult,
    payment: &PaymentAccounts,
) -> Result<Simulated, SolanaError> {
    const METHOD: &str = "simulateTransaction";
    let simulation = super::context_value(METHOD, answer)?;
    let error = simulation.get("err").filter(|err| !err.is_null());
    if let Some(error) = error {
        return Ok(Simulated::ReadApart(Some(error.to_string())));
    }
    let Some(accounts) = simulation.get("accounts").filter(|a| !a.is_null()) else {
        return Ok(Simulated::ReadApart(None));
    };
    let accounts = three(METHOD, accounts)?;
    let after = |at: usize| token_account(&accounts[at]);
    let (source, destination) = before(payment, after(0), after(1)).ok_or({
        SolanaError::Malformed {
            method: METHOD,
            what: "a balance beyond u64 before the transfer",
        }
    })?;
    Ok(Simulated::Read(Box::new(PaymentState {
        source,
        destination,
        mint_refusal: mint_refusal(&accounts[2]),
        simulation_error: None,
    })))
}

/// `getMultipleAccounts`' answer, read, beside the simulation's error.
pub(super) fn read_accounts(
    answer: CallResult,
    simulation_error: Option<String>,
) -> Result<PaymentState, SolanaError> {
    const METHOD: &str = "getMultipleAccounts";
    let accounts = super::context_value(METHOD, answer)?;
    let accounts = three(METHOD, &accounts)?;
    Ok(PaymentState {
        source: token_account(&accounts[0]),
        destination: token_account(&accounts[1]),
        mint_refusal: mint_refusal(&accounts[2]),
        simulation_error,
    })
}

fn three<'v>(method: &'static str, accounts: &'v Value) -> Result<&'v [Value], SolanaError> {
    let accounts = accounts.as_array().filter(|a| a.len() == 3);
    accounts.map(Vec::as_slice).ok_or(SolanaError::Malformed {
        method,
        what: "not three accounts",
    })
}

/// The source and destination before a transfer of the amount that left them as `source` and
/// `destination`: the source held the amount more, the destination as much less (one account
/// both, which a transfer leaves as it was, held what it holds). `None` for a source whose balance
/// before would pass u64: no token account holds that.
fn before(
    payment: &PaymentAccounts,
    source: Option<TokenAccount>,
    destination: Option<TokenAccount>,
) -> Option<(Option<TokenAccount>, Option<TokenAccount>)> {
    if payment.source == payment.destination {
        return Some((source, destination));
    }
    let source = match source {
        Some(s) => Some(TokenAccount {
            amount: s.amount.checked_add(payment.amount)?,
            delegate: delegated_before(&s, payment)?,
            ..s
        }),
        None => None,
    };
    let destination = destination.map(|d| TokenAccount {
        amount: d.amount.saturating_sub(payment.amount),
        ..d
    });
    Some((source, destination))
}

/// The source's delegate before a transfer that ran: a delegate's transfer spent as much of its
/// allowance, and the token program removes a delegate whose allowance it spent to 0. `None`
/// for an allowance beyond u64.
fn delegated_before(after: &TokenAccount, payment: &PaymentAccounts) -> Option<Option<Delegation>> {
    if payment.authority == &after.owner {
        return Some(after.delegate);
    }
    let spent = match after.delegate {
        Some(d) if d.delegate == *payment.authority => d.amount.checked_add(payment.amount)?,
        Some(other) => return Some(Some(other)),
        None => payment.amount,
    };
    Some(Some(Delegation {
        delegate: *payment.authority,
        amount: spent,
    }))
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::STANDARD as BASE64;
    use base64::Engine;

    use super::*;

    fn account(mint: &Pubkey, holder: &Pubkey, amount: u64) -> Value {
        let mut data = [mint.to_bytes(), holder.to_bytes()].concat();
        data.extend(amount.to_le_bytes());
        data.extend([0; 93]);
        json!({"owner": Pubkey::new_unique().to_string(), "data": [BASE64.encode(data), "base64"]})
    }

    fn answer(err: Value, accounts: Value) -> CallResult {
        Ok(json!({"context": {"slot": 1}, "value": {"err": err, "accounts": accounts}}))
    }

    #[test]
    fn the_accounts_after_the_transfer_give_the_balances_before_it() {
        let (source, destination, mint) = (
            Pubkey::new_unique(),
            Pubkey::new_unique(),
            Pubkey::new_unique(),
        );
        let holder = Pubkey::new_unique();
        let payment = PaymentAccounts {
            source: &source,
            destination: &destination,
            mint: &mint,
            amount: 100,
            authority: &holder,
        };
        let accounts = json!([
            account(&mint, &holder, 900),
            account(&mint, &holder, 5),
            Value::Null
        ]);
        let Simulated::Read(state) =
            read_simulation(answer(Value::Null, accounts), &payment).expect("read")
        else {
            panic!("a simulation that ran")
        };
        assert_eq!(state.source.map(|s| s.amount), Some(1000));
        assert_eq!(state.destination.map(|d| d.amount), Some(0));
        assert_eq!(state.simulation_error, None);
        let past = json!([account(&mint, &holder, u64::MAX), Value::Null, Value::Null]);
        assert!(matches!(
            read_simulation(answer(Value::Null, past), &payment),
            Err(SolanaError::Malformed { .. })
        ));
    }

    #[test]
    fn a_failed_simulation_or_no_accounts_reads_them_apart() {
        let key = Pubkey::new_unique();
        let payment = PaymentAccounts {
            source: &key,
            destination: &key,
            mint: &key,
            amount: 1,
            authority: &key,
        };
        let nulls = json!([null, null, null]);
        let failed = read_simulation(answer(json!("BlockhashNotFound"), nulls), &payment);
        assert!(
            matches!(failed, Ok(Simulated::ReadApart(Some(e))) if e == "\"BlockhashNotFound\"")
        );
        let ignored = read_simulation(answer(Value::Null, Value::Null), &payment);
        assert!(matches!(ignored, Ok(Simulated::ReadApart(None))));
        let two = read_simulation(answer(Value::Null, json!([null, null])), &payment);
        assert!(matches!(two, Err(SolanaError::Malformed { .. })));
    }

    #[test]
    fn a_delegates_transfer_spent_as_much_of_its_allowance() {
        let (source, destination, mint) = (
            Pubkey::new_unique(),
            Pubkey::new_unique(),
            Pubkey::new_unique(),
        );
        let (owner, delegate) = (Pubkey::new_unique(), Pubkey::new_unique());
        let after = |left: Option<u64>| TokenAccount {
            program: Pubkey::new_unique(),
            mint,
            owner,
            amount: 900,
            delegate: left.map(|amount| Delegation { delegate, amount }),
        };
        let by = |authority| PaymentAccounts {
            source: &source,
            destination: &destination,
            mint: &mint,
            amount: 100,
            authority,
        };
        let allowance = |state: Option<Option<Delegation>>| state.map(|d| d.map(|d| d.amount));
        let before = |left, authority| delegated_before(&after(left), &by(authority));
        assert_eq!(allowance(before(Some(50), &delegate)), Some(Some(150)));
        // Spent to 0: the token program removed the delegate.
        assert_eq!(allowance(before(None, &delegate)), Some(Some(100)));
        // The owner's transfer leaves the delegate as it was.
        assert_eq!(allowance(before(Some(50), &owner)), Some(Some(50)));
        assert_eq!(before(None, &owner), Some(None));
        assert_eq!(before(Some(u64::MAX), &delegate), None, "beyond u64");
    }
}
