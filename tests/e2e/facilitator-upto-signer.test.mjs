// Only the signer an `upto` payment names sends it (spec/access.md section 2): x402's upto proxy
// takes the transaction only from the facilitator in the signed witness, so a transaction from
// any other signer reverts `UnauthorizedFacilitator` at the operator's expense (and cools the
// payer down). Two signers; the node refuses every transaction of the named one (signer 2) as
// "insufficient funds", as it does for a drained hot wallet. The payment fails with no
// transaction, and the other signer (signer 1) sends nothing:
// - on one daemon, where an unfunded lane used to hand the settlement to another signer;
// - on two instances sharing one PostgreSQL, where the instance that holds no lane queues the
//   claim and the instance that holds both lanes takes it from the queue.
// An `upto` payment naming signer 1 still settles, from signer 1.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { UptoEvmScheme as UptoEvmClientScheme } from '@x402/evm/upto/client';
import { getAddress, recoverTransactionAddress } from 'viem';
import { startFacilitatorStack, withLogTail, throughProxy, CHAIN_ID } from './lib/stack.mjs';
import { startRouterd } from './lib/routerd.mjs';
import { anvilAccount, anvilKey, freshAccount, ROLE } from './lib/accounts.mjs';
import { expectSettled } from './lib/expect.mjs';
import { startRefusingProxy } from './lib/hostile.mjs';
import {
  UPTO_PROXY, TEST_TOKEN_EIP712, approvePermit2, deployTestToken, mintTestToken, placePermit2,
} from './lib/permit2.mjs';
import { freePort, makeTempDir, readAnswer } from './lib/util.mjs';

const repo = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const pgCluster = join(repo, 'scripts', 'pg-cluster');
const NETWORK = `eip155:${CHAIN_ID}`;
const PRICE = '10000';
const FUNDS = 1_000_000n;
const SECOND_SIGNER = 7; // an anvil account no role uses
const UNFUNDED = getAddress(anvilAccount(SECOND_SIGNER).address);
const payTo = anvilAccount(ROLE.payee).address;

let stack;
let proxy;
let token;
let pgDir;
const instances = [];
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

/** The node refuses every raw transaction signed by the named signer, as a node does for a drained wallet. */
async function refuseUnfunded(call) {
  if (call.method !== 'eth_sendRawTransaction') return null;
  const from = await recoverTransactionAddress({ serializedTransaction: call.params[0] });
  if (getAddress(from) !== UNFUNDED) return null;
  return { code: -32000, message: 'insufficient funds for gas * price + value' };
}

before(async () => {
  proxy = await startRefusingProxy({ refuse: refuseUnfunded });
  stack = await startFacilitatorStack({
    anvil: { blockTime: 1 },
    extraSignerKeys: [anvilKey(SECOND_SIGNER)],
    routerd: { x402Versions: [1, 2], settleTimeoutSecs: 30 },
    rpcUrlFor: throughProxy(proxy),
  });
  assert.equal(getAddress(stack.signers[1]), UNFUNDED);
  await placePermit2(stack.client);
  token = await deployTestToken(stack.client);
  stack.reconfigure({
    chainExtra: `[chains.${stack.network}.tokens.TT]\naddress = "${token}"\neip712_name = "${TEST_TOKEN_EIP712.name}"\n`
      + `eip712_version = "${TEST_TOKEN_EIP712.version}"\ntransfer_methods = ["permit2"]\n`,
  });
  await stack.routerd.restart();
});

after(async () => {
  await Promise.all(instances.map((r) => r.stop()));
  await stack?.stop();
  await proxy?.close();
  if (pgDir) {
    spawnSync(pgCluster, ['stop', pgDir], { stdio: 'ignore' });
    rmSync(pgDir, { recursive: true, force: true });
  }
});

/** A payer with ETH, the token, and Permit2 approved. */
async function newPayer() {
  const payer = freshAccount();
  await stack.anvil.rpc('anvil_setBalance', [payer.address, '0xde0b6b3a7640000']);
  await mintTestToken(stack.client, token, payer.address, FUNDS);
  await approvePermit2(payer, stack.client, token);
  return payer;
}

/** The upto client's v2 body for a PRICE permit whose witness names `facilitatorAddress`, charging it all. */
async function uptoBody(payer, facilitatorAddress) {
  const reqs = {
    scheme: 'upto', network: NETWORK, amount: PRICE, asset: getAddress(token), payTo, maxTimeoutSeconds: 60,
    extra: { ...TEST_TOKEN_EIP712, facilitatorAddress: getAddress(facilitatorAddress) },
  };
  const partial = await new UptoEvmClientScheme(payer).createPaymentPayload(2, reqs);
  const paymentPayload = { ...partial, x402Version: 2, resource: { url: 'https://example.com/r', description: 'e2e', mimeType: 'application/json' }, accepted: reqs };
  return { x402Version: 2, paymentPayload, paymentRequirements: reqs };
}

async function settleAt(url, body) {
  return readAnswer(await fetch(`${url}/settle`, {
    method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' },
  }));
}

const nonces = () => Promise.all(stack.signers.map((address) => stack.client.getTransactionCount({ address, blockTag: 'pending' })));
const tokenBalance = (address) => stack.client.readContract({
  address: token, abi: [{ type: 'function', name: 'balanceOf', stateMutability: 'view', inputs: [{ type: 'address' }], outputs: [{ type: 'uint256' }] }],
  functionName: 'balanceOf', args: [address],
});

/** Settles upto payments naming the unfunded signer at `url`: each fails unsent; no signer's nonce moves. */
async function expectFailUnsent(url, count) {
  const payers = [];
  for (let i = 0; i < count; i += 1) payers.push(await newPayer()); // one deployer: one mint at a time
  const bodies = await Promise.all(payers.map((p) => uptoBody(p, UNFUNDED)));
  const before = await nonces();
  const answers = await Promise.all(bodies.map((b) => settleAt(url, b)));
  for (const res of answers) {
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.success, false, `failed: ${res.text}`);
    assert.equal(res.body.transaction, '', `no transaction: ${res.text}`);
    assert.match(res.body.errorMessage ?? '', /cannot pay for gas/, res.text);
  }
  await new Promise((resolve) => { setTimeout(resolve, 3_000); }); // a few blocks for anything sent to land
  assert.deepEqual(await nonces(), before, 'no signer sent a transaction');
  for (const p of payers) assert.equal(await tokenBalance(p.address), FUNDS, 'nothing moved');
  const refused = proxy.state.refused.filter((c) => c.method === 'eth_sendRawTransaction').length;
  assert.ok(refused >= count, `the named signer's transactions reached the node, which refused them (${refused})`);
}

/** An upto payment naming the funded signer settles at `url`, sent by it. */
async function expectFundedSignerSettles(url) {
  const payer = await newPayer();
  const res = await settleAt(url, await uptoBody(payer, stack.signer));
  const hash = expectSettled(res, { network: NETWORK, payer: getAddress(payer.address) });
  const tx = await stack.client.getTransaction({ hash });
  assert.equal(getAddress(tx.from), getAddress(stack.signer));
  assert.equal(getAddress(tx.to), getAddress(UPTO_PROXY));
}

it('one daemon: an upto payment naming an unfunded signer fails with no transaction; the other signer sends nothing', async () => {
  await expectFailUnsent(stack.url, 1);
  await expectFundedSignerSettles(stack.url);
});

/** The stack's config with the shared database instead of sled. */
function instanceConfig(port, id) {
  const sled = /\[storage\]\npath = "[^"]*"\n/;
  const toml = stack.configToml({ port });
  assert.match(toml, sled);
  return toml.replace(sled, `[storage]\nbackend = "postgres"\nlease_ttl_secs = 2\ninstance_id = "${id}"\n`);
}

async function startInstance(i, url) {
  const port = await freePort();
  return startRouterd({
    configToml: instanceConfig(port, `instance-${i}`),
    dir: makeTempDir(`routerd-upto-${i}-`).dir,
    port,
    env: { ROUTERD_SIGNER_KEY: stack.signerKeys.join(','), ROUTERD__STORAGE__POSTGRES_URL: url },
  });
}

it('two instances on PostgreSQL: claims queued by the instance holding no lane are sent by the named signer only, or fail unsent', async () => {
  pgDir = mkdtempSync(join(tmpdir(), 'routerd-pg-'));
  const url = execFileSync(pgCluster, ['start', pgDir], { encoding: 'utf8', timeout: 300_000 }).trim();
  await stack.routerd.stop(); // it holds the same keys
  // One after another: the first holds both lanes, the second none (its claims are queued).
  for (let i = 0; i < 2; i += 1) instances.push(await startInstance(i, url));
  const [holder, queuer] = instances;
  // Several at once: without the named signer on the queue, some would go to the funded lane.
  await expectFailUnsent(queuer.url, 4);
  await expectFundedSignerSettles(queuer.url);
  await expectFundedSignerSettles(holder.url);
});
