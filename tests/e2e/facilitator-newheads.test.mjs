// New heads by subscription: with `ws_urls`, routerd learns of each block from the node's
// eth_subscribe("newHeads") instead of its poll. Here the poll is made useless (every 10 minutes),
// so settlements on a chain with 1 s blocks can only be answered if the subscription works.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startFacilitatorStack, withLogTail } from './lib/stack.mjs';
import { TX_HASH } from './lib/expect.mjs';

let stack;
const it = (name, fn) => test(name, { timeout: 120_000 }, withLogTail(() => stack, fn));

before(async () => {
  stack = await startFacilitatorStack({ anvil: { blockTime: 1 }, fundedPayers: 3, routerd: { settleTimeoutSecs: 15 } });
  const ws = stack.anvil.url.replace(/^http/, 'ws');
  stack.reconfigure({ chainExtra: `poll_interval_ms = 600000\nws_urls = ["${ws}"]\n` });
  await stack.routerd.restart();
});

after(() => stack?.stop());

it('with ws_urls and a 10-minute poll, settlements on 1 s blocks are answered: each block arrives by subscription', async () => {
  for (const account of stack.payers) {
    const p = await stack.pay({ account });
    const res = await stack.settle(p.body);
    assert.equal(res.body?.success, true, res.text);
    assert.match(res.body.transaction, TX_HASH);
    const receipt = await stack.receipt(res.body.transaction);
    assert.equal(receipt.status, 'success');
  }
});

it('a ws_urls entry that is not ws:// or wss:// is refused naming the key', async () => {
  const { execFileSync } = await import('node:child_process');
  const { writeFileSync } = await import('node:fs');
  const { join } = await import('node:path');
  const file = join(stack.tmp.dir, 'bad-ws.toml');
  writeFileSync(file, stack.configToml({ chainExtra: 'ws_urls = ["http://127.0.0.1:1"]\n' }));
  let err;
  try {
    execFileSync(stack.routerd.bin, ['check-config', '--config', file], { stdio: 'pipe', env: { ...process.env, ROUTERD_SIGNER_KEY: stack.signerKeys[0] } });
  } catch (e) {
    err = e;
  }
  assert.ok(err, 'check-config accepted an http URL in ws_urls');
  assert.equal(err.status, 2);
  assert.match(`${err.stderr}${err.stdout}`, /ws_urls/);
});
