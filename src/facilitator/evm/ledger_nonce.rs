//! Where the token or Permit2 marks a payment's nonce used. The ledger stores how a payment's
//! funds move (`TransferMethod`); what to read on chain for it is the EVM mechanism's to know.

use ethers_core::types::{Address, H256};

use crate::evm::NonceRead;
use crate::ledger::{EvmPart, TransferMethod};

/// Where a payment of `token` by `payer` moved by `method` marks `nonce` used.
pub fn nonce_read(
    method: TransferMethod,
    token: Address,
    payer: Address,
    nonce: H256,
) -> NonceRead {
    match method {
        TransferMethod::Eip3009 => NonceRead::erc3009(token, payer, nonce),
        TransferMethod::Permit2 => NonceRead::permit2(payer, nonce),
        TransferMethod::Call => NonceRead::none_at(token),
    }
}

/// Where a settlement's authorization nonce is marked used.
pub fn record_nonce_read(evm: &EvmPart) -> NonceRead {
    nonce_read(evm.method, evm.token, evm.payer, evm.nonce)
}
