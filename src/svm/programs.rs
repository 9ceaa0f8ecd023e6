//! The programs a payment transaction may invoke. Their ids are fixed on every Solana cluster.

use solana_pubkey::Pubkey;

pub const COMPUTE_BUDGET: Pubkey =
    Pubkey::from_str_const("ComputeBudget111111111111111111111111111111");
pub const TOKEN: Pubkey = Pubkey::from_str_const("TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA");
pub const TOKEN_2022: Pubkey =
    Pubkey::from_str_const("TokenzQdBNbLqP5VEhdkAS6EPFLC1PHnBqCXEpPxuEb");
pub const ASSOCIATED_TOKEN: Pubkey =
    Pubkey::from_str_const("ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL");
/// SPL Memo v2, the only memo program `@x402/svm` accepts.
pub const MEMO: Pubkey = Pubkey::from_str_const("MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr");
/// Lighthouse: wallet-side assertions (Phantom adds them); they can only make a transaction fail.
pub const LIGHTHOUSE: Pubkey =
    Pubkey::from_str_const("L2TExMFKdjpN9kozasaurPirfHy9P8sbXoAN1qA3S95");

/// The two token programs whose `TransferChecked` moves a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenProgram {
    Token,
    Token2022,
}

impl TokenProgram {
    pub fn from_id(id: &Pubkey) -> Option<Self> {
        match *id {
            TOKEN => Some(Self::Token),
            TOKEN_2022 => Some(Self::Token2022),
            _ => None,
        }
    }

    pub fn id(self) -> Pubkey {
        match self {
            Self::Token => TOKEN,
            Self::Token2022 => TOKEN_2022,
        }
    }
}
