// Every ERC-6492 case again, on a node that ignores eth_call state overrides: routerd reads the
// chain with a batch of plain calls, and deploys the wallet for verify's ERC-1271 question through
// Multicall3 inside an eth_call (facilitator-erc6492.test.mjs, batch mode).
globalThis.ERC6492_READS = 'batch';
await import('./facilitator-erc6492.test.mjs');
