// Hand-assembled contracts for the router tests (no compiler needed).

// Runtime code that reverts every call the way `require(false, "nope")` does: with the ABI
// encoding of Error("nope") as revert data.
//   7f 08c379a0 00..00   PUSH32 Error(string) selector, left-aligned
//   60 00 52             MSTORE at 0            -> memory[0..4]   = 0x08c379a0
//   60 20 60 04 52       MSTORE(4, 0x20)        -> memory[4..36]  = offset of the string
//   60 04 60 24 52       MSTORE(0x24, 4)        -> memory[36..68] = length 4
//   63 6e6f7065 60 e0 1b PUSH4 "nope", SHL 224  -> left-aligned bytes
//   60 44 52             MSTORE(0x44, ...)      -> memory[68..100] = "nope"
//   60 64 60 00 fd       REVERT(0, 100)
export const REVERT_NOPE_RUNTIME = `0x7f08c379a0${'00'.repeat(28)}`
  + '600052' + '6020600452' + '6004602452' + '636e6f706560e01b' + '604452' + '60646000fd';

// The revert data the contract above produces: Error("nope").
export const NOPE_REVERT_DATA = `0x08c379a0${'20'.padStart(64, '0')}${'4'.padStart(64, '0')}${'6e6f7065'.padEnd(64, '0')}`;

// Runtime code that accepts every call and does nothing: STOP.
export const STOP_RUNTIME = '0x00';

/**
 * Init code that deploys `runtime` (at most 255 bytes): copy the runtime that follows this
 * 11-byte header to memory and return it.
 *   60 L  80  60 0b  60 00  39   PUSH1 L, DUP1, PUSH1 11, PUSH1 0, CODECOPY(0, 11, L)
 *   60 00 f3                     RETURN(0, L)
 */
export function initCodeFor(runtime) {
  const body = runtime.slice(2);
  const length = body.length / 2;
  if (!Number.isInteger(length) || length === 0 || length > 255) throw new Error(`runtime of ${length} bytes`);
  const l = length.toString(16).padStart(2, '0');
  return `0x60${l}80600b6000396000f3${body}`;
}
