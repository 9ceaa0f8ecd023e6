// Compiles VerifyLens.sol with solc-js and prints its runtime bytecode as 0x-hex.
// Settings are pinned (compiler version in package.json, EVM version, optimizer, no metadata
// hash) so the same source always gives the same bytes: scripts/build-lens --check relies on it.
// EVM version paris: no PUSH0, so the code runs on chains that have not adopted Shanghai.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import solc from 'solc';

const here = dirname(fileURLToPath(import.meta.url));
const input = {
  language: 'Solidity',
  sources: { 'VerifyLens.sol': { content: readFileSync(join(here, 'VerifyLens.sol'), 'utf8') } },
  settings: {
    evmVersion: 'paris',
    optimizer: { enabled: true, runs: 200 },
    metadata: { bytecodeHash: 'none', appendCBOR: false },
    outputSelection: { '*': { VerifyLens: ['evm.deployedBytecode.object'] } },
  },
};
const output = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (output.errors ?? []).filter((e) => e.severity === 'error');
if (errors.length) {
  for (const e of errors) console.error(e.formattedMessage);
  process.exit(1);
}
console.log(`0x${output.contracts['VerifyLens.sol'].VerifyLens.evm.deployedBytecode.object}`);
