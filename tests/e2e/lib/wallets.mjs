// Hand-assembled ERC-1271 smart wallets, installed with anvil_setCode (no compiler needed).

// Runtime code that answers every call with bytes4(0x1626ba7e) left-aligned in one word, i.e. the
// ERC-1271 magic value of isValidSignature(bytes32,bytes) for any digest and signature:
//   63 1626ba7e   PUSH4 0x1626ba7e
//   60 e0 1b      PUSH1 224, SHL        -> 0x1626ba7e << 224
//   60 00 52      PUSH1 0, MSTORE       -> memory[0..32] = that word
//   60 20 60 00 f3  PUSH1 32, PUSH1 0, RETURN
export const ERC1271_ALWAYS_VALID = '0x631626ba7e60e01b60005260206000f3';

// Runtime code that answers every call with one zero word: isValidSignature never says yes.
//   60 20 60 00 f3  PUSH1 32, PUSH1 0, RETURN (memory is zero)
export const ERC1271_ALWAYS_INVALID = '0x60206000f3';
