// The KYT deny list as the Treasury publishes it (issue 48, access.md 3c): routerd started with
// `facilitator.deny_list_file` holding the SDN advanced XML refuses an EVM payer listed there,
// `check-config` says how many addresses it took and from which format, the file replaced by the
// SDN CSV and SIGHUP make the CSV's payer refused and the XML's accepted, and a partial download
// then SIGHUP keeps the list in force, the log saying why; a 60 MB XML is read as a stream (the
// peak RSS barely moves). The same holds for Solana payers (a second routerd, on the Solana test
// node): the XML's SOL key is refused, then the CSV's after SIGHUP. The shipped samples
// (tests/fixtures/sdn/) are the published formats; one ETH address and the SOL key of each are
// swapped for test payers'.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { startFacilitatorStack, withLogTail } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { expectInvalid, expectValid } from './lib/expect.mjs';
import { routerdBin, startRouterd, freePort } from './lib/routerd.mjs';
import { makeTempDir, sleep } from './lib/util.mjs';
import { startSvmNode, newSolanaKeypair, svmFacilitatorConfig, newFeePayer, postTo, DEVNET_USDC_MINT } from './lib/svm.mjs';
import { svmPaymentBody } from './lib/svm-payment.mjs';

const FIXTURES = new URL('../fixtures/sdn/', import.meta.url);
const XML = readFileSync(new URL('sdn_advanced_sample.xml', FIXTURES), 'utf8');
const CSV = readFileSync(new URL('sdn_sample.csv', FIXTURES), 'latin1');
// The first ETH address each sample lists.
const XML_LISTED = '0x098B716B8Aaf21512996dC57EB0615e2383E2f96';
const CSV_LISTED = '0x8576aCC5C05D6Ce88f4e49bf65BdF0C62F91353C';
const XML_SOL = 'Fq3pRa6QUEvgmjWsePtFvgt2VSQe2UnspTMaGbRCrSys';
const CSV_SOL = '3CBwgSdKhe9ixNTxNLGNeGRb4hWQTi1fs3aYKzUNLRbi';
const KYT = 'invalid_exact_evm_payload_authorization_from_address_kyt';

const inXml = freshAccount();
const inCsv = freshAccount();
let xml;
let csv;

let stack;
let denyListFile;
// The Solana half: its node, routerd, fee payer, payers listed in each sample, and a payee.
const svm = {};
const it = (name, fn) => test(name, { timeout: 60_000 }, withLogTail(() => stack, fn));

before(async () => {
  for (const [text, listed] of [[XML, [XML_LISTED, XML_SOL]], [CSV, [CSV_LISTED, CSV_SOL]]]) {
    for (const entry of listed) assert.ok(text.includes(entry), `the sample lists ${entry}`);
  }
  [svm.inXml, svm.inCsv, svm.payee] = await Promise.all([1, 2, 3].map(() => newSolanaKeypair()));
  xml = XML.replace(XML_LISTED, inXml.address).replace(XML_SOL, svm.inXml.address);
  csv = CSV.replace(CSV_LISTED, inCsv.address).replace(CSV_SOL, svm.inCsv.address);
  // The stack writes one line per entry: the document's own lines, to `deny.txt` (the format is
  // told by content, not by name).
  stack = await startFacilitatorStack({ denyList: xml.split('\n') });
  denyListFile = stack.config.denyListFile;
  for (const payer of [inXml, inCsv]) await stack.mint(payer.address, 1_000_000n);
});

after(async () => {
  await stack?.stop();
  await svm.routerd?.stop();
  await svm.node?.stop();
  svm.tmp?.cleanup();
});

const verifyFrom = async (account) => stack.verify((await stack.pay({ account })).body);

/** `routerd check-config` on the running daemon's configuration: {status, out}. */
function checkConfig(configFile = stack.routerd.configFile) {
  const run = spawnSync(routerdBin(), ['check-config', '--config', configFile], {
    env: { ...process.env, ROUTERD_SIGNER_KEY: stack.signerKey }, encoding: 'utf8', timeout: 30_000,
  });
  return { status: run.status, out: run.stdout + run.stderr };
}

/** SIGHUP, then wait until the log says the reload's outcome (matching `line`). */
async function hangUp(line) {
  const before = stack.routerd.tail(10_000).split('\n').filter((l) => line.test(l)).length;
  stack.routerd.child.kill('SIGHUP');
  for (let i = 0; i < 300; i += 1) {
    const now = stack.routerd.tail(10_000).split('\n').filter((l) => line.test(l)).length;
    if (now > before) return;
    await sleep(100);
  }
  assert.fail(`no log line ${line} after SIGHUP`);
}

it('started with the SDN advanced XML: its ETH payer is refused, another is not', async () => {
  expectInvalid(await verifyFrom(inXml), KYT, { payer: inXml.address });
  expectValid(await verifyFrom(inCsv), { payer: inCsv.address });
  assert.match(stack.routerd.tail(400),
    /facilitator\.deny_list_file: 3 EVM addresses and 1 Solana key from the SDN advanced XML/);
});

it('check-config says how many addresses it took and from which format', () => {
  const { status, out } = checkConfig();
  assert.equal(status, 0, out);
  assert.match(out, /# facilitator\.deny_list_file: 3 EVM addresses and 1 Solana key from the SDN advanced XML \(1 address of other chains left out, 1 not well-formed skipped\)/);
});

it('the file replaced by the SDN CSV and SIGHUP: the CSV payer is refused, the XML payer accepted', async () => {
  writeFileSync(denyListFile, csv, 'latin1');
  await hangUp(/deny_list_file reloaded: 3 EVM addresses and 1 Solana key from the SDN CSV/);
  expectInvalid(await verifyFrom(inCsv), KYT, { payer: inCsv.address });
  expectValid(await verifyFrom(inXml), { payer: inXml.address });
  const { status, out } = checkConfig();
  assert.equal(status, 0, out);
  assert.match(out, /# facilitator\.deny_list_file: 3 EVM addresses and 1 Solana key from the SDN CSV/);
});

it('a partial download and SIGHUP keep the list in force, and the log says why', async () => {
  writeFileSync(denyListFile, xml.slice(0, xml.indexOf('</DistinctParties>')));
  await hangUp(/deny_list_file not reloaded; the previous list stays: the SDN advanced XML ends before <\/Sanctions>/);
  expectInvalid(await verifyFrom(inCsv), KYT, { payer: inCsv.address });
  expectValid(await verifyFrom(inXml), { payer: inXml.address });
  assert.ok(stack.routerd.running);
  // The same file stops a start, and check-config names it.
  const { status, out } = checkConfig();
  assert.equal(status, 2, out);
  assert.match(out, /facilitator\.deny_list_file: the SDN advanced XML ends before <\/Sanctions>: a partial download\?/);
});

/** The peak resident set of a process (kB), from /proc. */
const peakRssKb = (pid) => Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmHWM:\s+(\d+) kB/m)[1]);

it('a 60 MB SDN advanced XML is read as a stream: the reload takes every address, and the peak RSS grows by far less than the file', async () => {
  // The published file is about 100 MB: parties repeated, each with an address of its own.
  const start = xml.indexOf('    <DistinctParty FixedRef="47121">');
  const end = xml.indexOf('  </DistinctParties>');
  const party = xml.slice(start, end);
  const parties = [];
  let bytes = 0;
  for (let i = 0; bytes < 60_000_000; i += 1) {
    const address = `0x${i.toString(16).padStart(40, '0')}`;
    parties.push(party.replace('0x7F367cC41522cE07553e823bf3be79A889DEbe1B', address));
    bytes += party.length;
  }
  writeFileSync(denyListFile, xml.slice(0, start) + parties.join('') + xml.slice(start));
  const before = peakRssKb(stack.routerd.child.pid);
  // The sample's three EVM addresses, and one per party added.
  await hangUp(new RegExp(`deny_list_file reloaded: ${parties.length + 3} EVM addresses and 1 Solana key from the SDN advanced XML`));
  const grown = peakRssKb(stack.routerd.child.pid) - before;
  console.log(`# reload of a ${bytes}-byte SDN advanced XML (${parties.length + 3} EVM addresses): peak RSS grew by ${grown} kB`);
  assert.ok(grown < 30_000, `peak RSS grew by ${grown} kB reading a file of ${bytes} bytes`);
  expectInvalid(await verifyFrom(inXml), KYT, { payer: inXml.address });
  expectValid(await verifyFrom(inCsv), { payer: inCsv.address });
});

// ---------------------------------------------------------------------------------------------
// Solana payers: the same file, the same reload

async function startSolana() {
  svm.tmp = makeTempDir('routerd-deny-list-sdn-svm-');
  svm.node = await startSvmNode({ slotMs: 100, logFile: join(svm.tmp.dir, 'svm-node.log') });
  ({ feePayer: svm.feePayer, feePayerFile: svm.feePayerFile } = await newFeePayer(svm.node, svm.tmp.dir));
  await svm.node.createMint({ decimals: 6, address: DEVNET_USDC_MINT });
  for (const who of [svm.inXml, svm.inCsv]) await svm.node.mintTo(DEVNET_USDC_MINT, who.address, 1_000_000n);
  await svm.node.createTokenAccount(DEVNET_USDC_MINT, svm.payee.address);
  svm.denyListFile = join(svm.tmp.dir, 'sdn_advanced.xml');
  writeFileSync(svm.denyListFile, xml);
  const config = svmFacilitatorConfig({
    port: await freePort(), storePath: join(svm.tmp.dir, 'store'), rpcUrl: svm.node.url, feePayerFile: svm.feePayerFile,
    facilitator: `deny_list_file = "${svm.denyListFile}"\n`,
  });
  svm.routerd = await startRouterd({ configToml: config, dir: svm.tmp.dir });
}

/** @x402/svm's v2 payment from `payer` to the payee, verified: the answer's body. */
async function verifySolana(payer) {
  const body = await svmPaymentBody({
    rpc: svm.node.url, signer: payer.signer, payTo: svm.payee.address, amount: 10_000, feePayer: svm.feePayer.address,
  });
  const res = await postTo(svm.routerd.url, '/verify', body);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  return res.body;
}

const expectDenied = (answer) => {
  assert.deepEqual([answer.isValid, answer.invalidReason], [false, 'invalid_payload'], JSON.stringify(answer));
  assert.match(answer.invalidMessage, /payer is on the deny list/);
};

test('Solana: the SOL key of the SDN XML is refused; after the CSV and SIGHUP, the CSV one is and the XML one is not', { timeout: 120_000 }, async () => {
  try {
    await startSolana();
    expectDenied(await verifySolana(svm.inXml));
    assert.equal((await verifySolana(svm.inCsv)).isValid, true);
    writeFileSync(svm.denyListFile, csv, 'latin1');
    svm.routerd.child.kill('SIGHUP');
    for (let i = 0; i < 100 && !svm.routerd.tail(400).includes('reloaded: 3 EVM addresses and 1 Solana key from the SDN CSV'); i += 1) {
      await sleep(100);
    }
    expectDenied(await verifySolana(svm.inCsv));
    assert.equal((await verifySolana(svm.inXml)).isValid, true);
  } catch (err) {
    err.message += `\n--- routerd log ---\n${svm.routerd?.tail(30) ?? ''}`;
    throw err;
  }
});
