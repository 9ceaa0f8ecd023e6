// The functions routerd runs, for link/code-order.txt (scripts/order-code drives this).
//
//   node bench/code-order.mjs verify                 verifies through a routerd (ROUTERD_BIN)
//   node bench/code-order.mjs collect DIR BIN OUT    callgrind's files in DIR -> OUT
//
// `verify` starts anvil with USDC and routerd, asks the plain endpoints, then sends three rounds
// of 40 concurrent verifies (shared lens calls) and a malformed body: the bench's verify phase
// waits 10 s for the lens, which routerd under valgrind does not always reach.
// `collect` reads every callgrind output file in DIR and writes the names of the functions of
// BIN that ran (those called from them too), the most instructions first, one per line.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { startFacilitatorStack } from '../tests/e2e/lib/stack.mjs';
import { freshAccount } from '../tests/e2e/lib/accounts.mjs';
import { sleep } from '../tests/e2e/lib/util.mjs';

async function verify() {
  const stack = await startFacilitatorStack({ fundedPayers: 8 });
  try {
    await sleep(8000); // the lens read mode, learnt slowly under valgrind
    for (const path of ['/supported', '/health', '/ready', '/metrics', '/discovery/resources']) await stack.request(path);
    const payTo = freshAccount().address;
    const post = (body) => fetch(`${stack.url}/verify`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    for (let round = 0; round < 3; round++) {
      const payments = await Promise.all(Array.from({ length: 40 }, (_, i) => stack.pay({ account: stack.payers[i % 8], payTo, amount: 1000n })));
      const answers = await Promise.all(payments.map(async (p) => (await post(JSON.stringify(p.body))).json()));
      const valid = answers.filter((a) => a.isValid === true).length;
      if (valid !== payments.length) throw new Error(`round ${round}: ${valid} of ${payments.length} verifies valid`);
      if ((await post('{"x":1}')).status !== 400) throw new Error('a malformed body was not refused');
    }
  } finally {
    await stack.stop();
  }
}

/** Self instructions per function of `bin`, from one callgrind output file (names compressed). */
function readCallgrind(file, bin, cost) {
  const objects = new Map();
  const functions = new Map();
  let inBin = false;
  let current;
  let afterCalls = false;
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    const ref = /^(c?)(ob|fn)=\((\d+)\)(?: (.*))?$/.exec(line);
    if (ref) {
      const [, called, kind, id, name] = ref;
      const names = kind === 'ob' ? objects : functions;
      if (name !== undefined) names.set(id, name);
      if (kind === 'ob' && !called) inBin = basename(names.get(id) ?? '') === bin;
      if (kind === 'fn' && !called) current = inBin ? names.get(id) : undefined;
      if (kind === 'fn' && called && names.has(id) && !cost.has(names.get(id))) cost.set(names.get(id), 0);
      if (current !== undefined && !cost.has(current)) cost.set(current, 0);
      continue;
    }
    if (line.startsWith('calls=')) {
      afterCalls = true; // the next cost line is the call's inclusive cost, not the caller's own
      continue;
    }
    const costLine = /^[0-9+*-]\S*\s+(\d+)/.exec(line);
    if (!costLine) continue;
    if (afterCalls) afterCalls = false;
    else if (current !== undefined) cost.set(current, cost.get(current) + Number(costLine[1]));
  }
}

function collect(dir, bin, out) {
  const cost = new Map();
  const files = readdirSync(dir).filter((f) => f.startsWith('callgrind.'));
  if (files.length === 0) throw new Error(`no callgrind output in ${dir}`);
  for (const f of files) readCallgrind(join(dir, f), basename(bin), cost);
  // callgrind names a function without a symbol by its address, and some by a demangled form
  // with spaces: neither is a name the linker can order.
  const symbol = (name) => !/^0x[0-9a-f]+$/.test(name) && !/\s/.test(name);
  const names = [...cost].filter(([name]) => symbol(name))
    .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).map(([name]) => name);
  writeFileSync(out, `${names.join('\n')}\n`);
  console.log(`code-order: ${names.length} functions from ${files.length} runs written to ${out}`);
}

const [command, ...args] = process.argv.slice(2);
if (command === 'verify') await verify();
else if (command === 'collect' && args.length === 3) collect(...args);
else {
  console.error('usage: node bench/code-order.mjs verify | collect DIR BIN OUT');
  process.exit(2);
}
process.exit(0);
