// Every verify rule again, on nodes that ignore eth_call state overrides: routerd must notice at
// start and read the chain with a batch of plain calls (facilitator-verify.test.mjs, batch mode).
globalThis.VERIFY_READS = 'batch';
await import('./facilitator-verify.test.mjs');
