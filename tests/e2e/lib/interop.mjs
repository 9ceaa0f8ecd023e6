// Steps shared by the x402 interop tests (x402-interop.test.mjs: the v1 packages,
// x402-interop-v2.test.mjs: the v2 ones): a resource server ("shop") in front of routerd, the
// payment header its client signs, and the duplicate-settlement attack on it. What differs between
// the versions (header names, receipt decoding, the refusal's shape) comes in as a `wire` object.
import assert from 'node:assert/strict';
import { TX_HASH } from './expect.mjs';

/** Serves the express `app` on a free 127.0.0.1 port: {server, url}. */
export async function listenShop(app) {
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return { server, url: `http://127.0.0.1:${server.address().port}` };
}

/**
 * Catches the payment header a paying client signs: `pay(inner)` makes the paid request through the
 * fetch `inner`, which answers 204 to the request carrying the header (read by
 * `headerOf(input, init)`) so it never reaches the server and the header is still unused; `made` is
 * the failure message when no header was made.
 */
export async function catchPaymentHeader({ pay, headerOf, made }) {
  let header;
  const inner = async (input, init) => {
    const value = headerOf(input, init);
    if (value) {
      header = value;
      return new Response(null, { status: 204 });
    }
    return fetch(input, init);
  };
  const res = await pay(inner);
  assert.equal(res.status, 204, 'the paid request was caught');
  assert.ok(typeof header === 'string' && header.length > 0, made);
  return header;
}

/**
 * The shop's answer `res` to a paid request: 200 with the report, and a receipt (`wire`'s receipt
 * header) telling a successful settlement on `network` paid by `payer`; returns the receipt.
 */
export async function expectDelivered(res, { wire, network, payer }) {
  const text = await res.text();
  assert.equal(res.status, 200, text);
  assert.deepEqual(JSON.parse(text), { report: 'sunny' });
  const receipt = wire.decodeReceipt(res.headers.get(wire.receiptHeader));
  assert.equal(receipt.success, true);
  assert.match(receipt.transaction, TX_HASH);
  assert.equal(receipt.network, network);
  assert.equal(receipt.payer, payer.address);
  return receipt;
}

/**
 * The duplicate-settlement attack (spec/access.md section 1) on the shop's paid `url`: a payer
 * funded with 1_000_000 atomic USDC has `capture(payer, url)` sign one payment header, which is then
 * sent in 5 concurrent requests: exactly one is delivered (200, the report, a successful receipt
 * whose transaction mined), the others are refused with 402 and no resource, the payee gets one
 * `price`, the payer pays once, in one settlement transaction; the same header once more later is
 * refused and nothing moves.
 * `wire`: {paymentHeader, receiptHeader, decodeReceipt(value), reasonOf(answer) (logged),
 * expectRefusedReceipt(answer, shown)}; an answer is {status, text, receipt, required} (the
 * receipt header's and the `payment-required` header's values).
 */
export async function expectReplayedHeaderBuysOnce({ stack, url, payTo, price, capture, wire }) {
  const payer = await stack.newPayer(1_000_000n);
  const header = await capture(payer, url);
  const payeeBefore = await stack.balanceOf(payTo);
  const signerNonce = await stack.signerNonce('pending');

  const answers = await Promise.all(Array.from({ length: 5 }, async () => {
    const res = await fetch(url, { headers: { [wire.paymentHeader]: header } });
    return { status: res.status, text: await res.text(), receipt: res.headers.get(wire.receiptHeader), required: res.headers.get('payment-required') };
  }));

  const shown = answers.map((a) => `${a.status} ${a.text.slice(0, 200)}`).join(' | ');
  console.log(`# statuses ${answers.map((a) => a.status).join(', ')}; refusals: ${answers.filter((a) => a.status !== 200).map(wire.reasonOf).join(', ')}`);
  const delivered = answers.filter((a) => a.status === 200);
  assert.equal(delivered.length, 1, `exactly one delivery: ${shown}`);
  assert.deepEqual(JSON.parse(delivered[0].text), { report: 'sunny' });
  const receipt = wire.decodeReceipt(delivered[0].receipt);
  assert.equal(receipt.success, true);
  assert.match(receipt.transaction, TX_HASH);
  for (const refused of answers.filter((a) => a !== delivered[0])) {
    assert.equal(refused.status, 402, `refused with 402: ${shown}`);
    assert.ok(!refused.text.includes('sunny'), `a refused request got the resource: ${shown}`);
    wire.expectRefusedReceipt(refused, shown);
  }
  assert.equal((await stack.receipt(receipt.transaction)).status, 'success');
  assert.equal(await stack.balanceOf(payTo), payeeBefore + BigInt(price), 'the payee received one price');
  assert.equal(await stack.balanceOf(payer.address), 1_000_000n - BigInt(price), 'the payer paid once');
  assert.equal(await stack.signerNonce('pending'), signerNonce + 1, 'one settlement transaction');

  // Later, the same header once more: refused, nothing moves.
  const late = await fetch(url, { headers: { [wire.paymentHeader]: header } });
  assert.equal(late.status, 402, await late.text());
  assert.equal(await stack.balanceOf(payTo), payeeBefore + BigInt(price));
}
