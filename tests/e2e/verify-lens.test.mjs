// The verify lens's `factsEach` (contracts/VerifyLens.sol), called straight on anvil with the
// state override routerd sends: several payments in one call answer exactly what each one's own
// `facts` call answers, a payment that changes state (an ERC-6492 deployment) does not change what
// the next one sees, a payer's wallet that burns its gas does not starve the ones after it, and no
// settlement is tried in it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { decodeFunctionResult, encodeFunctionData, keccak256, parseAbi, toHex } from 'viem';
import { privateKeyToAccount, generatePrivateKey } from 'viem/accounts';
import { startFacilitatorStack } from './lib/stack.mjs';
import { freshAccount } from './lib/accounts.mjs';
import { LENS_ABI, erc3009Ask, lensEthCall } from './lib/lens.mjs';
import { placeSmartWalletFactory, smartAccountFor } from './lib/smart-wallet.mjs';

const AUTHORIZATION_STATE_ABI = parseAbi(['function authorizationState(address authorizer, bytes32 nonce)']);
/** Code that loops until its gas is gone: JUMPDEST, PUSH1 0, JUMP. */
const BURNER = '0x5b600056';

let stack;
before(async () => {
  stack = await startFacilitatorStack();
  await placeSmartWalletFactory(stack.client);
});
after(async () => stack?.stop());

/** An ask as routerd writes it for an ERC-3009 payment from `from`, with a fresh nonce and payee. */
const ask = ({ from, ...more }) => erc3009Ask({
  token: stack.usdc, from, payTo: freshAccount().address, nonce: keccak256(toHex(`${from}${Math.random()}`)),
  ...more, ...(more.trialCall ? { trialTarget: stack.usdc } : {}),
});

/** The lens called straight on anvil, as routerd calls it. */
function call(data) {
  const { method, params } = lensEthCall(data);
  return stack.anvil.rpc(method, params);
}
const facts = (a) => call(encodeFunctionData({ abi: LENS_ABI, functionName: 'facts', args: [a] }));
async function factsEach(asks) {
  const answer = await call(encodeFunctionData({ abi: LENS_ABI, functionName: 'factsEach', args: [asks] }));
  return decodeFunctionResult({ abi: LENS_ABI, functionName: 'factsEach', data: answer });
}
/** `from`'s code size before and after the deployment asked: words 3 and 4 of an encoded `Facts`
 * (word 0 is the struct's offset, then blockNumber and timestamp). */
const word = (encoded, i) => BigInt(`0x${encoded.slice(2 + 64 * i, 2 + 64 * (i + 1))}`);
const codeSizes = (encoded) => [word(encoded, 3), word(encoded, 4)];

test('each payment of factsEach answers what its own facts call answers', async () => {
  const yes = await stack.smartWallet({ valid: true });
  const asks = [
    ask({ from: freshAccount().address }),
    ask({ from: yes, erc1271Call: '0x1626ba7e' }),
    ask({ from: freshAccount().address }),
  ];
  const each = await factsEach(asks);
  assert.equal(each.length, asks.length);
  for (const [i, a] of asks.entries()) assert.equal(each[i], await facts(a), `ask ${i}`);
});

test('a payment that deploys its wallet (ERC-6492) is undone before the next one is read', async () => {
  const owner = privateKeyToAccount(generatePrivateKey());
  const wallet = await smartAccountFor(stack.client, owner);
  const { factory, factoryData } = await wallet.getFactoryArgs();
  const deploying = () => ask({ from: wallet.address, factory, factoryCall: factoryData });
  const asks = [deploying(), deploying()];
  const each = await factsEach(asks);
  for (const [i, encoded] of each.entries()) {
    // Not deployed before its own ask, deployed by it: the first ask's deployment was undone.
    assert.deepEqual(codeSizes(encoded).map((n) => n > 0n), [false, true], `ask ${i}`);
    assert.equal(encoded, await facts(asks[i]), `ask ${i}`);
  }
});

test('wallets that burn their gas starve nobody after them: each is answered nothing, the others their facts', async () => {
  const burners = [freshAccount().address, freshAccount().address, freshAccount().address];
  for (const b of burners) await stack.anvil.rpc('anvil_setCode', [b, BURNER]);
  const honest = [ask({ from: freshAccount().address }), ask({ from: freshAccount().address })];
  const asks = [...burners.map((from) => ask({ from, erc1271Call: '0x1626ba7e' })), ...honest];
  const each = await factsEach(asks);
  assert.deepEqual(each.slice(0, burners.length), burners.map(() => '0x'), 'a burner\'s answer is unknown, not "no"');
  for (const [i, a] of honest.entries()) assert.equal(each[burners.length + i], await facts(a), `honest ask ${i}`);
});

test('a settlement is never tried in factsEach: the reads before it warmed what its gas is measured cold on', async () => {
  const payer = freshAccount().address;
  const trying = ask({ from: payer, trialCall: encodeFunctionData({ abi: AUTHORIZATION_STATE_ABI, functionName: 'authorizationState', args: [payer, keccak256('0x01')] }) });
  const each = await factsEach([ask({ from: payer }), trying, ask({ from: payer })]);
  assert.equal(each[1], '0x', 'the ask with a trial is answered nothing');
  assert.notEqual(each[0], '0x');
  assert.notEqual(each[2], '0x');
});
