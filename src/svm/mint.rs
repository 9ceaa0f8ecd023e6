//! Token-2022 mint extensions that change what a payee receives from a `TransferChecked` of the
//! required amount, or that let the transfer fail after verify passed it: a payment in such a mint
//! is refused (`access.md` 3c). An SPL Token mint has no extensions.
//!
//! The layout is read here rather than through `spl-token-2022-interface`: that crate brings the
//! confidential transfer proofs (`solana-zk-sdk` and its curve arithmetic) and a dozen `spl-*`
//! crates for the five fixed-size records read below. Token-2022 lays a mint out as the SPL
//! Token mint (82 bytes), zeros up to the token account's length (165), one account type byte
//! (1: mint), then type-length-value records: a `u16` type, a `u16` length, the value.
//!
//! Extensions accepted: `PermanentDelegate` (the issuer's power over balances once paid, as SPL
//! USDC's freeze authority is; the transfer credits the amount), the confidential transfer ones
//! (a `TransferChecked` moves the public balance, and the rules allow no other transfer),
//! metadata, groups, interest and UI scaling (display only), and a mint close authority.

use solana_pubkey::Pubkey;

/// The SPL Token mint's length, which Token-2022's base layout shares.
const BASE_MINT_LEN: usize = 82;
/// Where Token-2022 writes the account type: after the token account's base length, so that a
/// mint and an account with extensions never have the same length.
const ACCOUNT_TYPE_AT: usize = 165;
const ACCOUNT_TYPE_MINT: u8 = 1;
const TLV_HEADER_LEN: usize = 4;

/// Token-2022's `ExtensionType` numbers this rule reads.
const UNINITIALIZED: u16 = 0;
const TRANSFER_FEE_CONFIG: u16 = 1;
const DEFAULT_ACCOUNT_STATE: u16 = 6;
const NON_TRANSFERABLE: u16 = 9;
const TRANSFER_HOOK: u16 = 14;
const PAUSABLE: u16 = 26;

/// `AccountState::Frozen`, `DefaultAccountState`'s one byte.
const FROZEN: u8 = 2;

/// Why a mint is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MintRefusal {
    #[error("it charges a transfer fee (up to {basis_points} basis points): the payee would receive less than the amount")]
    TransferFee { basis_points: u16 },
    #[error(
        "it calls transfer hook program {program} on every transfer, which may change or fail it"
    )]
    TransferHook { program: Pubkey },
    #[error("it is pausable: its authority can stop every transfer between verify and settle")]
    Pausable,
    #[error("its token accounts start frozen: a payee's account cannot receive until the issuer thaws it")]
    DefaultFrozen,
    #[error("it is non-transferable")]
    NonTransferable,
    #[error("its account data is not a Token-2022 mint's layout")]
    Malformed,
}

/// The first extension of the mint in `data` (its account's data) that refuses it, if any.
pub fn refusal(data: &[u8]) -> Option<MintRefusal> {
    if data.len() <= BASE_MINT_LEN {
        return None;
    }
    if data.get(ACCOUNT_TYPE_AT) != Some(&ACCOUNT_TYPE_MINT) {
        return Some(MintRefusal::Malformed);
    }
    let mut rest = &data[ACCOUNT_TYPE_AT + 1..];
    while rest.len() >= TLV_HEADER_LEN {
        let kind = u16::from_le_bytes([rest[0], rest[1]]);
        let len = usize::from(u16::from_le_bytes([rest[2], rest[3]]));
        // Zeros after the last record: the account was sized for more than it holds.
        if kind == UNINITIALIZED {
            return None;
        }
        let Some(value) = rest.get(TLV_HEADER_LEN..TLV_HEADER_LEN + len) else {
            return Some(MintRefusal::Malformed);
        };
        if let Some(refusal) = extension(kind, value) {
            return Some(refusal);
        }
        rest = &rest[TLV_HEADER_LEN + len..];
    }
    None
}

/// One record's verdict; `None` for an extension that leaves the transfer as it is.
fn extension(kind: u16, value: &[u8]) -> Option<MintRefusal> {
    match kind {
        TRANSFER_FEE_CONFIG => transfer_fee(value),
        TRANSFER_HOOK => transfer_hook(value),
        PAUSABLE => Some(MintRefusal::Pausable),
        NON_TRANSFERABLE => Some(MintRefusal::NonTransferable),
        DEFAULT_ACCOUNT_STATE => match value {
            [FROZEN] => Some(MintRefusal::DefaultFrozen),
            [_] => None,
            _ => Some(MintRefusal::Malformed),
        },
        _ => None,
    }
}

/// `TransferFeeConfig`: two authorities (32 bytes each), the withheld amount (8), then the older
/// and the newer `TransferFee` (epoch u64, maximum fee u64, basis points u16). Which one applies
/// depends on the epoch: a fee in either is refused, as it is or soon will be charged.
fn transfer_fee(value: &[u8]) -> Option<MintRefusal> {
    const FEES_AT: usize = 72;
    const FEE_LEN: usize = 18;
    if value.len() != FEES_AT + 2 * FEE_LEN {
        return Some(MintRefusal::Malformed);
    }
    let charges = |fee: &[u8]| {
        let maximum = u64::from_le_bytes(fee[8..16].try_into().expect("8 bytes"));
        let basis_points = u16::from_le_bytes([fee[16], fee[17]]);
        (maximum > 0 && basis_points > 0).then_some(basis_points)
    };
    let older = charges(&value[FEES_AT..FEES_AT + FEE_LEN]);
    let newer = charges(&value[FEES_AT + FEE_LEN..]);
    let basis_points = older.into_iter().chain(newer).max()?;
    Some(MintRefusal::TransferFee { basis_points })
}

/// `TransferHook`: its authority, then the hook program (all zeros: none).
fn transfer_hook(value: &[u8]) -> Option<MintRefusal> {
    let program = value.get(32..).and_then(|p| <[u8; 32]>::try_from(p).ok());
    let Some(program) = program else {
        return Some(MintRefusal::Malformed);
    };
    let program = Pubkey::from(program);
    (program != Pubkey::default()).then_some(MintRefusal::TransferHook { program })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A Token-2022 mint's data with `records` (type, value) after its base layout.
    pub(crate) fn mint_with(records: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut data = vec![0; ACCOUNT_TYPE_AT];
        data[45] = 1; // initialised
        data.push(ACCOUNT_TYPE_MINT);
        for (kind, value) in records {
            data.extend(kind.to_le_bytes());
            data.extend(u16::try_from(value.len()).unwrap().to_le_bytes());
            data.extend(value);
        }
        data
    }

    /// `TransferFeeConfig` with the same fee in both epochs.
    pub(crate) fn fee_config(basis_points: u16, maximum: u64) -> Vec<u8> {
        let mut value = vec![0; 72];
        for _ in 0..2 {
            value.extend(0u64.to_le_bytes());
            value.extend(maximum.to_le_bytes());
            value.extend(basis_points.to_le_bytes());
        }
        value
    }

    #[test]
    fn a_mint_without_extensions_passes() {
        assert_eq!(refusal(&[0; BASE_MINT_LEN]), None);
        assert_eq!(refusal(&mint_with(&[])), None);
        // Metadata pointer (18) and a permanent delegate (12) leave the transfer as it is.
        let harmless = mint_with(&[(18, vec![7; 64]), (12, vec![3; 32])]);
        assert_eq!(refusal(&harmless), None);
        // Zeros after the records end them.
        let mut padded = mint_with(&[(18, vec![7; 64])]);
        padded.extend([0; 40]);
        assert_eq!(refusal(&padded), None);
    }

    #[test]
    fn a_transfer_fee_in_either_epoch_refuses_the_mint() {
        let fee = mint_with(&[(18, vec![7; 64]), (TRANSFER_FEE_CONFIG, fee_config(100, 5))]);
        assert_eq!(
            refusal(&fee),
            Some(MintRefusal::TransferFee { basis_points: 100 })
        );
        let mut newer_only = fee_config(0, 0);
        newer_only[72 + 18 + 8..72 + 18 + 16].copy_from_slice(&9u64.to_le_bytes());
        newer_only[72 + 18 + 16..].copy_from_slice(&50u16.to_le_bytes());
        assert_eq!(
            refusal(&mint_with(&[(TRANSFER_FEE_CONFIG, newer_only)])),
            Some(MintRefusal::TransferFee { basis_points: 50 })
        );
        // A zero fee (or a zero maximum) charges nothing.
        for (bps, max) in [(0, 5), (100, 0)] {
            let config = mint_with(&[(TRANSFER_FEE_CONFIG, fee_config(bps, max))]);
            assert_eq!(refusal(&config), None);
        }
    }

    #[test]
    fn hooks_pausing_frozen_accounts_and_non_transferable_refuse_the_mint() {
        let program = Pubkey::new_unique();
        let hook = [[5; 32], program.to_bytes()].concat();
        assert_eq!(
            refusal(&mint_with(&[(TRANSFER_HOOK, hook)])),
            Some(MintRefusal::TransferHook { program })
        );
        assert_eq!(refusal(&mint_with(&[(TRANSFER_HOOK, vec![0; 64])])), None);
        assert_eq!(
            refusal(&mint_with(&[(PAUSABLE, vec![0; 33])])),
            Some(MintRefusal::Pausable)
        );
        assert_eq!(
            refusal(&mint_with(&[(DEFAULT_ACCOUNT_STATE, vec![FROZEN])])),
            Some(MintRefusal::DefaultFrozen)
        );
        assert_eq!(
            refusal(&mint_with(&[(DEFAULT_ACCOUNT_STATE, vec![1])])),
            None
        );
        assert_eq!(
            refusal(&mint_with(&[(NON_TRANSFERABLE, vec![])])),
            Some(MintRefusal::NonTransferable)
        );
    }

    #[test]
    fn a_broken_layout_is_refused_not_read_past() {
        let mut wrong_type = mint_with(&[]);
        wrong_type[ACCOUNT_TYPE_AT] = 2;
        assert_eq!(refusal(&wrong_type), Some(MintRefusal::Malformed));
        let mut cut = mint_with(&[(TRANSFER_FEE_CONFIG, fee_config(100, 5))]);
        cut.truncate(cut.len() - 1);
        assert_eq!(refusal(&cut), Some(MintRefusal::Malformed));
        let short_fee = mint_with(&[(TRANSFER_FEE_CONFIG, vec![1; 10])]);
        assert_eq!(refusal(&short_fee), Some(MintRefusal::Malformed));
        assert_eq!(
            refusal(&mint_with(&[(DEFAULT_ACCOUNT_STATE, vec![])])),
            Some(MintRefusal::Malformed)
        );
        assert_eq!(refusal(&[1; 100]), Some(MintRefusal::Malformed));
    }
}
