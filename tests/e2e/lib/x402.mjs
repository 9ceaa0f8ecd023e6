// x402 v1 "exact" EVM payments as a client builds them: EIP-3009 authorizations signed with EIP-712,
// and the /verify and /settle request bodies that carry them.
import { getAddress, toHex } from 'viem';
import { randomBytes } from 'node:crypto';

export const TRANSFER_WITH_AUTHORIZATION_TYPES = Object.freeze({
  TransferWithAuthorization: [
    { name: 'from', type: 'address' },
    { name: 'to', type: 'address' },
    { name: 'value', type: 'uint256' },
    { name: 'validAfter', type: 'uint256' },
    { name: 'validBefore', type: 'uint256' },
    { name: 'nonce', type: 'bytes32' },
  ],
});

export const now = () => Math.floor(Date.now() / 1000);
export const randomNonce = () => toHex(randomBytes(32));

/**
 * Sign an ERC-3009 TransferWithAuthorization with `account` (a viem local account).
 * `from` defaults to the account; it differs for "signed by someone else" and smart-wallet cases.
 * @param {{account: import('viem').LocalAccount, token: {address: string, name?: string, version?: string},
 *   chainId: number, from?: string, to: string, value: bigint|string|number, validAfter: bigint|string|number,
 *   validBefore: bigint|string|number, nonce: `0x${string}`}} a
 * @returns {Promise<`0x${string}`>} 65-byte signature
 */
export function signAuthorization({ account, token, chainId, from, to, value, validAfter, validBefore, nonce }) {
  return account.signTypedData({
    domain: {
      name: token.name ?? 'USD Coin',
      version: token.version ?? '2',
      chainId,
      verifyingContract: getAddress(token.address),
    },
    types: TRANSFER_WITH_AUTHORIZATION_TYPES,
    primaryType: 'TransferWithAuthorization',
    message: {
      from: getAddress(from ?? account.address),
      to: getAddress(to),
      value: BigInt(value),
      validAfter: BigInt(validAfter),
      validBefore: BigInt(validBefore),
      nonce,
    },
  });
}

/**
 * Build a signed, well-formed payment: the authorization matches the requirements exactly unless
 * overridden, so each test changes only the one thing it is about.
 * @param {object} o
 * @param {import('viem').LocalAccount} o.account    signs (and pays, unless `from` is given)
 * @param {{address: string, name?: string, version?: string}} o.token
 * @param {string} o.network
 * @param {number} o.chainId                         EIP-712 domain chain id
 * @param {string} o.payTo
 * @param {bigint|number|string} [o.amount=1000]     maxAmountRequired and (by default) value
 * @param {object} [o.auth]                          overrides for the signed authorization fields
 * @returns {Promise<{body: object, authorization: object, signature: string, requirements: object, payload: object}>}
 */
export async function buildPayment({ account, token, network, chainId, payTo, amount = 1000n, auth = {} }) {
  const t = now();
  const a = {
    from: account.address,
    to: payTo,
    value: BigInt(amount),
    validAfter: BigInt(t - 600),
    validBefore: BigInt(t + 600),
    nonce: randomNonce(),
    ...auth,
  };
  const signature = await signAuthorization({ account, token, chainId, ...a });
  const authorization = {
    from: a.from,
    to: a.to,
    value: a.value.toString(),
    validAfter: a.validAfter.toString(),
    validBefore: a.validBefore.toString(),
    nonce: a.nonce,
  };
  const payload = { x402Version: 1, scheme: 'exact', network, payload: { signature, authorization } };
  const requirements = paymentRequirements({ network, amount, payTo, asset: token.address });
  return { body: { x402Version: 1, paymentPayload: payload, paymentRequirements: requirements }, authorization, signature, requirements, payload };
}

/**
 * The same payment in x402 v2's shapes, as @x402/fetch and @x402/express build it: CAIP-2
 * network, `amount`, the payload's `accepted` requirements and `resource`. The signed
 * authorization is `p`'s own, so the v1 body `p.body` and this one carry one payment.
 * @param {{authorization: object, signature: string, requirements: object}} p  from buildPayment
 * @param {number} chainId
 */
export function toV2(p, chainId) {
  const r = p.requirements;
  const requirements = {
    scheme: r.scheme,
    network: `eip155:${chainId}`,
    amount: r.maxAmountRequired,
    asset: r.asset,
    payTo: r.payTo,
    maxTimeoutSeconds: r.maxTimeoutSeconds,
    extra: r.extra,
  };
  const payload = {
    x402Version: 2,
    resource: { url: r.resource, description: r.description, mimeType: r.mimeType },
    accepted: structuredClone(requirements),
    payload: { signature: p.signature, authorization: p.authorization },
  };
  return { x402Version: 2, paymentPayload: payload, paymentRequirements: requirements };
}

/** Payment requirements as a resource server (x402-express) would state them. */
export function paymentRequirements({ network, amount, payTo, asset, name = 'USD Coin', version = '2' }) {
  return {
    scheme: 'exact',
    network,
    maxAmountRequired: BigInt(amount).toString(),
    resource: 'https://example.com/r',
    description: 'e2e test resource',
    mimeType: 'application/json',
    payTo,
    maxTimeoutSeconds: 60,
    asset,
    extra: { name, version },
  };
}

/** Deep copy of a body with `edit(copy)` applied: tests mutate one field of a valid payment. */
export function mutate(body, edit) {
  const copy = structuredClone(body);
  edit(copy);
  return copy;
}

/** Replace the signature's v byte (last byte), e.g. with 0x1d, which no signer produces. */
export function withV(signature, v) {
  return `${signature.slice(0, 130)}${v.toString(16).padStart(2, '0')}`;
}

const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;

/** The malleable twin (r, n - s, flipped v): recovers to the same key but has a high s. */
export function highS(signature) {
  const r = signature.slice(2, 66);
  const s = BigInt(`0x${signature.slice(66, 130)}`);
  const v = parseInt(signature.slice(130, 132), 16);
  const s2 = (SECP256K1_N - s).toString(16).padStart(64, '0');
  const v2 = v === 27 ? 28 : 27;
  return `0x${r}${s2}${v2.toString(16)}`;
}
