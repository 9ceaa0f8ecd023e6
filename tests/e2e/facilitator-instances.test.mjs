// Several routerd instances on one PostgreSQL (storage.backend = "postgres"), all loading the same
// signer key: one lane, held by one instance at a time through its lease. A payment sent several
// times at once, spread over instances, is settled by one transaction that every answer names, and
// exactly one answer is its success (spec/access.md section 1: the others are told the transaction
// as a failure, and a retry with the successful request's Idempotency-Key on another instance gets
// the success again); when the instance
// holding the lane is SIGKILLed mid-burst another takes the lane over and finishes its
// settlements; an instance paused past its lease (SIGSTOP, then SIGCONT) signs nothing more;
// PostgreSQL restarted mid-burst makes settle answer 503 while it is down and loses nothing.
// Every run ends with the signer's history audited from the chain: one transaction per payment,
// consecutive nonces, none reverted, none wasted.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startFacilitatorStack } from './lib/stack.mjs';
import { startRouterd } from './lib/routerd.mjs';
import { chainMark, expectCleanSignerHistory, expectTransfersAuthorization } from './lib/chain-audit.mjs';
import { isPending } from './lib/settling.mjs';
import { expectDuplicate, expectSettled, show } from './lib/expect.mjs';
import {
  freePort, makeTempDir, readAnswer, sleep, idempotencyKey, IDEMPOTENCY_KEY,
} from './lib/util.mjs';

const repo = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const pgCluster = join(repo, 'scripts', 'pg-cluster');
const LEASE_TTL_SECS = 2;
const PAYMENTS = Number(process.env.ROUTERD_E2E_INSTANCE_PAYMENTS ?? 500);

let stack;
let pgDir;
let url;
const instances = [];

/** The stack's config with the shared database instead of sled. */
function instanceConfig(port, id) {
  const sled = /\[storage\]\npath = "[^"]*"\n/;
  const toml = stack.configToml({ port });
  assert.match(toml, sled);
  return toml.replace(sled, `[storage]\nbackend = "postgres"\nlease_ttl_secs = ${LEASE_TTL_SECS}\ninstance_id = "${id}"\n`);
}

async function startInstance(i) {
  const port = await freePort();
  const dir = makeTempDir(`routerd-instance-${i}-`).dir;
  return startRouterd({
    configToml: instanceConfig(port, `instance-${i}`),
    dir,
    port,
    env: { ROUTERD_SIGNER_KEY: stack.signerKey, ROUTERD__STORAGE__POSTGRES_URL: url },
  });
}

before(async () => {
  pgDir = mkdtempSync(join(tmpdir(), 'routerd-pg-'));
  url = execFileSync(pgCluster, ['start', pgDir], { encoding: 'utf8', timeout: 300_000 }).trim();
  // Blocks every second, as a chain makes them. Under anvil's automine, hundreds of settlements
  // sent at once by several instances made it mine concurrently and replace its own blocks, and
  // once it kept a transaction at the signer's next nonce queued with nothing left to mine it:
  // no block came, and the burst stalled behind it.
  stack = await startFacilitatorStack({ anvil: { blockTime: 1 }, fundedPayers: 50, routerd: { settleTimeoutSecs: 10 } });
  // The stack's own (sled) daemon holds the same key: it must not run beside the instances.
  await stack.routerd.stop();
  // One after another: the first holds the lane, the others stand by.
  for (let i = 0; i < 3; i += 1) instances.push(await startInstance(i));
});

after(async () => {
  await Promise.all(instances.map((r) => r.stop()));
  await stack?.stop();
  if (pgDir) {
    spawnSync(pgCluster, ['stop', pgDir], { stdio: 'ignore' });
    rmSync(pgDir, { recursive: true, force: true });
  }
});

/** POST /settle to one instance, with `key` as the Idempotency-Key header when given. */
async function post(instance, body, key) {
  try {
    return await readAnswer(await fetch(`${instance.url}/settle`, {
      method: 'POST',
      body: JSON.stringify(body),
      headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { [IDEMPOTENCY_KEY]: key }) },
    }));
  } catch (err) {
    return { status: 0, error: err }; // the instance is down
  }
}

/**
 * Settle as a resource server with several facilitator addresses would: ask `order[0]`; on a
 * pending answer or a dead instance, ask the next one (round robin) until an answer, every time
 * with the same Idempotency-Key (`key`, fresh by default) and body, so that a retry of the request
 * that claimed the payment is told its outcome.
 */
async function settleSomewhere(order, body, { tries = 40, key = idempotencyKey() } = {}) {
  let res;
  for (let i = 0; i < tries; i += 1) {
    res = await post(order[i % order.length], body, key);
    if (res.status !== 0 && !isPending(res)) return res;
    if (res.status === 0) await sleep(100);
  }
  return res;
}

function payments(count) {
  return Promise.all(Array.from({ length: count }, (_, i) => stack.pay({ account: stack.payers[i % stack.payers.length] })));
}

/** Every answer successful, its transaction mined once with exactly its own transfer. */
async function audit(mark, settled) {
  const history = await expectCleanSignerHistory(stack.anvil, { signer: stack.signer, usdc: stack.usdc, mark });
  assert.equal(history.other.length, 0, 'only settlements and nonce fillers');
  assert.equal(history.selfTransfers.length, 0, 'no nonce wasted on a filler');
  assert.equal(history.settlements.length, settled.length, 'one transaction per payment');
  const byHash = new Map(history.settlements.map((t) => [t.hash.toLowerCase(), t]));
  for (const { p, res } of settled) {
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.equal(res.body.success, true, JSON.stringify(res.body));
    const tx = byHash.get(res.body.transaction.toLowerCase());
    assert.ok(tx, `answered transaction ${res.body.transaction} is a mined settlement`);
    expectTransfersAuthorization(tx.logs, stack.usdc, p.authorization, res.body.transaction);
  }
}

function log(instance) {
  return readFileSync(instance.logFile, 'utf8');
}

describe('three instances, one key, one PostgreSQL', () => {
  const it = (name, fn) => test(name, { timeout: 600_000 }, async () => {
    try {
      await fn();
    } catch (err) {
      for (const [i, r] of instances.entries()) err.message += `\n--- instance ${i} log tail ---\n${r.tail(30)}`;
      throw err;
    }
  });

  it('one payment sent 5 times at once, spread over two instances: exactly one success, every answer names its one transaction', async () => {
    const mark = await chainMark(stack.anvil, stack.signer);
    const [p, q] = await payments(2);
    const payer = p.authorization.from;
    const duplicateOf = (hash, who) => ({ transaction: hash, network: stack.network, payer: who });

    // Identical requests (the same body, no key), as a payer replaying one payment header would send them.
    const answers = await Promise.all(Array.from({ length: 5 }, (_, k) => post(instances[k % 2], p.body)));
    const winners = answers.filter((res) => res.body?.success === true);
    assert.equal(winners.length, 1, `exactly one success: ${answers.map((r) => show(r)).join(' | ')}`);
    const hash = expectSettled(winners[0], { network: stack.network, payer });
    for (const res of answers.filter((r) => r !== winners[0])) expectDuplicate(res, duplicateOf(hash, payer));
    // Later, on the third instance: told the transaction, not success.
    expectDuplicate(await post(instances[2], p.body), duplicateOf(hash, payer));

    // Five requests of one payment, each with its own key: the one that claimed it, retried on
    // another instance, gets its success again; the others stay duplicates.
    const keys = Array.from({ length: 5 }, () => idempotencyKey());
    const keyed = await Promise.all(keys.map((key, k) => settleSomewhere([instances[k % 2], instances[(k + 1) % 2]], q.body, { key })));
    const w = keyed.findIndex((res) => res.body?.success === true);
    assert.ok(w >= 0 && keyed.filter((res) => res.body?.success === true).length === 1, `exactly one success: ${keyed.map((r) => show(r)).join(' | ')}`);
    const qHash = expectSettled(keyed[w], { network: stack.network, payer: q.authorization.from });
    for (const [k, res] of keyed.entries()) if (k !== w) expectDuplicate(res, duplicateOf(qHash, q.authorization.from));
    for (const other of [instances[(w + 1) % 2], instances[2]]) {
      assert.equal(expectSettled(await post(other, q.body, keys[w]), { network: stack.network, payer: q.authorization.from }), qHash, 'the claiming request retried on another instance');
    }
    expectDuplicate(await post(instances[2], q.body, keys[(w + 1) % 5]), duplicateOf(qHash, q.authorization.from));

    await audit(mark, [{ p, res: winners[0] }, { p: q, res: keyed[w] }]);
  });

  it(`${PAYMENTS} payments, each sent to two instances at once: one transaction per payment, both answers name it, one of them its success`, async () => {
    const mark = await chainMark(stack.anvil, stack.signer);
    const ps = await payments(PAYMENTS);
    const settled = [];
    // In waves, as clients would arrive: every payment reaches two different instances together.
    for (let start = 0; start < ps.length; start += 50) {
      const wave = ps.slice(start, start + 50);
      await Promise.all(wave.map(async (p, k) => {
        const i = (start + k) % 3;
        const [a, b] = await Promise.all([
          settleSomewhere([instances[i], instances[(i + 1) % 3]], p.body),
          settleSomewhere([instances[(i + 1) % 3], instances[i]], p.body),
        ]);
        const both = JSON.stringify([a.body, b.body]);
        assert.equal(a.body?.transaction, b.body?.transaction, `both answers name one transaction: ${both}`);
        const wins = [a, b].filter((res) => res.body?.success === true);
        assert.equal(wins.length, 1, `exactly one of the two answers is the success: ${both}`);
        expectDuplicate(wins[0] === a ? b : a, { transaction: wins[0].body.transaction, network: stack.network, payer: p.authorization.from });
        settled.push({ p, res: wins[0] });
      }));
    }
    await audit(mark, settled);
  });

  it(`the instance holding the lane is SIGKILLed mid-burst of ${PAYMENTS}: the others take it over and finish, nothing reverts, no nonce wasted`, async () => {
    const mark = await chainMark(stack.anvil, stack.signer);
    const holder = instances[0];
    assert.doesNotMatch(log(holder), /standing by/, 'the first instance holds the lane');
    const ps = await payments(PAYMENTS);
    const settle = (p, k) => {
      const order = [instances[k % 3], instances[(k + 1) % 3], instances[(k + 2) % 3]];
      return settleSomewhere(order, p.body, { tries: 80 }).then((res) => ({ p, res }));
    };
    // A fifth settles first. The kill then lands just as the rest is sent: the holder answers a
    // full block's worth at once, so a kill timed on the answers counted so far could land after
    // every payment was answered, with nothing left for the others to take over.
    const killAfter = Math.ceil(PAYMENTS / 5);
    const settled = await Promise.all(ps.slice(0, killAfter).map(settle));
    const rest = Promise.all(ps.slice(killAfter).map((p, k) => settle(p, k + killAfter)));
    await sleep(20);
    await holder.kill();
    settled.push(...await rest);
    const took = instances.slice(1).filter((r) => /taking the lane over/.test(log(r)));
    // Under this load the lane may change hands again between the survivors (a holder whose
    // renewal runs late loses it, safely, to the fence); what matters is the audit below.
    assert.ok(took.length >= 1, 'a surviving instance took the lane over');
    await audit(mark, settled);
  });

  it('an instance paused past its lease (SIGSTOP, SIGCONT) signs nothing with a stale nonce; its payments settle through the holder', async () => {
    const mark = await chainMark(stack.anvil, stack.signer);
    const holder = instances.slice(1).find((r) => /taking the lane over/.test(log(r)));
    const other = instances.slice(1).find((r) => r !== holder);
    const before = await payments(40);
    const during = await payments(40);
    const after = await payments(40);
    const settled = [];
    for (const p of before) settled.push({ p, res: await settleSomewhere([holder], p.body) });
    process.kill(holder.child.pid, 'SIGSTOP');
    try {
      // Past the lease: the other instance takes the lane over and settles meanwhile.
      settled.push(...await Promise.all(during.map(async (p) => ({ p, res: await settleSomewhere([other], p.body, { tries: 80 }) }))));
    } finally {
      process.kill(holder.child.pid, 'SIGCONT');
    }
    // The woken instance is asked at once: it must find its lease gone before signing anything.
    settled.push(...await Promise.all(after.map(async (p) => ({ p, res: await settleSomewhere([holder, other], p.body, { tries: 80 }) }))));
    assert.match(log(other), /taking the lane over/);
    assert.match(log(holder), /lane lease (taken by another instance|lost before signing)/);
    await audit(mark, settled);
  });

  it('PostgreSQL restarted mid-burst: settle answers HTTP 400 {error: 503} while it is down, nothing is lost, work resumes', async () => {
    const mark = await chainMark(stack.anvil, stack.signer);
    const live = instances.filter((r) => r.running);
    assert.equal(live.length, 2);
    const ps = await payments(60);
    const keys = ps.map(() => idempotencyKey()); // one request per payment, asked again below
    const [early, whileDown] = [ps.slice(0, 40), ps.slice(40)];
    const burst = Promise.all(early.map((p, k) => post(live[k % 2], p.body, keys[k])));
    execFileSync(pgCluster, ['stop', pgDir], { stdio: 'ignore' });
    let restarted = false;
    try {
      const answers = await Promise.all(whileDown.map((p, k) => post(live[k % 2], p.body, keys[40 + k])));
      for (const res of answers) {
        assert.equal(res.status, 400, JSON.stringify(res.body));
        assert.equal(res.body.error, 503, JSON.stringify(res.body));
        assert.match(res.body.message, /the store could not be read or written/, JSON.stringify(res.body));
        assert.doesNotMatch(res.body.message, /PostgreSQL|db error|postgres:/i, "the database's own words stay in the log");
      }
      await burst;
      execFileSync(pgCluster, ['start', pgDir], { stdio: 'ignore', timeout: 120_000 });
      restarted = true;
    } finally {
      if (!restarted) spawnSync(pgCluster, ['start', pgDir], { stdio: 'ignore' });
    }
    // Back: every payment is asked again (as its resource server would) until it is answered;
    // blocks are mined meanwhile so that the lane sees new heads.
    const settled = await Promise.all(ps.map(async (p, k) => {
      let res;
      for (let i = 0; i < 60; i += 1) {
        res = await post(live[(k + i) % 2], p.body, keys[k]);
        if (res.status === 200) break;
        await stack.anvil.mine();
        await sleep(200);
      }
      return { p, res };
    }));
    await audit(mark, settled);
  });
});
