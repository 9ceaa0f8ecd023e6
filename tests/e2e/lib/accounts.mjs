// Who is who on the anvil chains. Anvil funds the first accounts of its default mnemonic with ETH.
// Roles are fixed so that the facilitator's signer is never a payer or payee in a test.
import { mnemonicToAccount, generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { bytesToHex } from 'viem';
import { pathToFileURL } from 'node:url';
import { realpathSync } from 'node:fs';

export const ANVIL_MNEMONIC = 'test test test test test test test test test test test junk';

export const ROLE = Object.freeze({
  deployer: 0, // deploys USDC; owner, master minter, minter, pauser and blacklister
  signer: 1, // routerd's facilitator key (pays the gas of settlements)
  payer: 2, // a funded payer for the interop test and the dev stack
  payee: 3, // a payTo for the interop test and the dev stack
});

/** The i-th anvil default account as a viem local account. */
export function anvilAccount(index) {
  return mnemonicToAccount(ANVIL_MNEMONIC, { addressIndex: index });
}

/** The i-th anvil default account's private key (0x-hex). */
export function anvilKey(index) {
  return bytesToHex(anvilAccount(index).getHdKey().privateKey);
}

/** A brand-new key nobody else uses: payers get fresh keys so balance checks are exact. */
export function freshAccount() {
  return privateKeyToAccount(generatePrivateKey());
}

// CLI: `node accounts.mjs` prints the roles as JSON ({deployer: {address, key}, signer: ...}) for
// scripts/dev-stack, so the shell never hard-codes keys or derives them itself.
if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  const roles = Object.fromEntries(Object.entries(ROLE).map(([role, i]) => [role, { address: anvilAccount(i).address, key: anvilKey(i) }]));
  console.log(JSON.stringify(roles, null, 2));
}
