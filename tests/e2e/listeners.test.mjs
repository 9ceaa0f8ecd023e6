// Which routes each listener serves: server.facilitator_listen splits the facilitator off to its
// own address; a daemon may serve only the router or only the facilitator (config.md).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { startAnvil } from './lib/anvil.mjs';
import { startRouterd } from './lib/routerd.mjs';
import { anvilKey, ROLE } from './lib/accounts.mjs';
import { freePort, makeTempDir } from './lib/util.mjs';

const TOKEN = '0x5FbDB2315678afecb367f032d93F642f64180aa3'; // /supported never calls it
let anvil;
const daemons = [];

before(async () => {
  anvil = await startAnvil({ chainId: 84532 });
});

after(async () => {
  for (const d of daemons) await d.stop();
  await anvil?.stop();
});

function config({ routerPort, facilitatorPort, router = true, facilitator = true }) {
  const dir = makeTempDir().dir;
  let toml = `[server]\nlisten = "127.0.0.1:${routerPort}"\n`;
  if (facilitatorPort) toml += `facilitator_listen = "127.0.0.1:${facilitatorPort}"\n`;
  toml += `shutdown_grace_secs = 5\n[storage]\npath = ${JSON.stringify(join(dir, 'db'))}\n`;
  toml += `[chains.base-sepolia]\nchain_id = 84532\nkind = "l2"\nrpc_urls = ["${anvil.url}"]\n`;
  toml += `[chains.base-sepolia.tokens.USDC]\naddress = "${TOKEN}"\neip712_name = "USD Coin"\neip712_version = "2"\n`;
  if (router) toml += '[router]\nchains = ["base-sepolia"]\n';
  if (facilitator) toml += '[facilitator]\nnetworks = ["base-sepolia"]\n';
  return { dir, configToml: toml };
}

async function start(opts, env = {}) {
  const { dir, configToml } = config(opts);
  const d = await startRouterd({ dir, configToml, port: opts.routerPort, env });
  daemons.push(d);
  return d;
}

const get = (port, path) => fetch(`http://127.0.0.1:${port}${path}`);
const rpc = (port, method, params = []) => fetch(`http://127.0.0.1:${port}/`, {
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
}).then((r) => r.json());

test('facilitator_listen: facilitator routes on their own address, the router on listen', async () => {
  const routerPort = await freePort();
  const facilitatorPort = await freePort();
  await start({ routerPort, facilitatorPort }, { ROUTERD_SIGNER_KEY: anvilKey(ROLE.signer) });

  const kinds = await get(facilitatorPort, '/supported');
  assert.equal(kinds.status, 200);
  assert.deepEqual((await kinds.json()).kinds, [{ x402Version: 1, scheme: 'exact', network: 'base-sepolia' }]);
  const onRouter = await get(routerPort, '/supported');
  assert.equal(onRouter.status, 404);
  assert.equal(typeof (await onRouter.json()).error, 'number');

  const chains = await rpc(routerPort, 'router_chains');
  assert.equal(chains.result[0].chain, 'base-sepolia');
  const rpcOnFacilitator = await fetch(`http://127.0.0.1:${facilitatorPort}/`, { method: 'POST', body: '{}' });
  assert.equal(rpcOnFacilitator.status, 404);

  for (const port of [routerPort, facilitatorPort]) {
    assert.equal((await get(port, '/health')).status, 200, `health on ${port}`);
  }
});

test('a router-only daemon needs no signer key and has no facilitator routes', async () => {
  const routerPort = await freePort();
  await start({ routerPort, facilitator: false });
  assert.equal((await get(routerPort, '/supported')).status, 404);
  assert.equal((await rpc(routerPort, 'router_chains')).result.length, 1);
});

test('a facilitator-only daemon answers the router method with "method not found"', async () => {
  const routerPort = await freePort();
  await start({ routerPort, router: false }, { ROUTERD_SIGNER_KEY: anvilKey(ROLE.signer) });
  assert.equal((await get(routerPort, '/supported')).status, 200);
  const answer = await rpc(routerPort, 'eth_routerTransaction', [{}]);
  assert.equal(answer.error.code, -32601);
});
