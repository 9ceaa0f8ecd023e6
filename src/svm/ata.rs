//! Associated token accounts: the one token account per (owner, mint, token program) that wallets
//! and `@x402/svm`'s client pay into. A payment must credit exactly this account of `payTo`.

use solana_pubkey::Pubkey;

use super::programs::{TokenProgram, ASSOCIATED_TOKEN};

/// The associated token account of `owner` for `mint` under `program`. The owner may be off the
/// curve (a program-derived address): derivation does not care.
pub fn associated_token_address(owner: &Pubkey, mint: &Pubkey, program: TokenProgram) -> Pubkey {
    let program = program.id();
    let seeds: [&[u8]; 3] = [owner.as_ref(), program.as_ref(), mint.as_ref()];
    Pubkey::find_program_address(&seeds, &ASSOCIATED_TOKEN).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_address_wallets_derive() {
        // Known answer from @solana-program/token's findAssociatedTokenPda: the USDC account of a fixed owner.
        let owner = Pubkey::from_str_const("9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM");
        let usdc = Pubkey::from_str_const("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v");
        let ata = associated_token_address(&owner, &usdc, TokenProgram::Token);
        assert_eq!(ata.to_string(), KNOWN_ATA);
        assert_ne!(
            ata,
            associated_token_address(&owner, &usdc, TokenProgram::Token2022)
        );
    }

    const KNOWN_ATA: &str = "FGETo8T8wMcN2wCjav8VK6eh3dLk63evNDPxzLSJra8B";
}
