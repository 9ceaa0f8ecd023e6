//! Where a payment's authorization nonce is marked used, whichever way the payment moves: the
//! token's `authorizationState` (ERC-3009), or a bit of Permit2's `nonceBitmap`.

use ethers_core::types::{Address, Bytes, H256, U256};

use super::{erc3009, permit2};

/// The read that says whether a nonce is used, and the bits of its answer that say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonceRead {
    pub target: Address,
    pub call: Bytes,
    pub mask: U256,
}

impl NonceRead {
    /// ERC-3009: `authorizationState(from, nonce)` on the token, true once used or cancelled.
    pub fn erc3009(token: Address, from: Address, nonce: H256) -> Self {
        NonceRead {
            target: token,
            call: erc3009::authorization_state(from, nonce),
            mask: U256::MAX,
        }
    }

    /// Permit2: the nonce's bit in `nonceBitmap(from, nonce >> 8)`.
    pub fn permit2(from: Address, nonce: H256) -> Self {
        let nonce = U256::from_big_endian(nonce.as_bytes());
        NonceRead {
            target: permit2::PERMIT2,
            call: permit2::nonce_bitmap(from, nonce),
            mask: permit2::nonce_bit(nonce),
        }
    }

    /// Whether the read's answer says the nonce is used.
    /// A call to the `batch-settlement` contract, which uses no payer's nonce: read as never
    /// used (a view of the contract that always answers a word, masked off).
    pub fn none_at(settlement: Address) -> Self {
        NonceRead {
            target: settlement,
            call: super::batch::refund_nonce(H256::zero()),
            mask: U256::zero(),
        }
    }

    pub fn used(&self, word: U256) -> bool {
        !(word & self.mask).is_zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permit2_nonce_is_used_when_its_bit_is_set() {
        let mut nonce = [0u8; 32];
        nonce[31] = 0x07;
        let read = NonceRead::permit2(Address::repeat_byte(1), H256(nonce));
        assert!(read.used(U256::from(0x80)));
        assert!(!read.used(U256::from(0x7f)));
        assert!(NonceRead::erc3009(Address::zero(), Address::zero(), H256::zero()).used(1.into()));
    }
}
