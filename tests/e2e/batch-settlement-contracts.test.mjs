// The on-chain parts of the x402 `batch-settlement` scheme (lib/batch-settlement.mjs) on their own,
// with no routerd: our escrow and deposit collectors at the canonical addresses, driven by the
// official @x402/evm 2.27.0 batch-settlement client and facilitator schemes (the facilitator run
// in-process with a viem signer) and Circle's USDC:
// - the compiled ABI holds every entry of @x402/evm's batch-settlement ABI, with the same shape,
//   and the contract computes channel ids and digests as @x402/evm does;
// - ERC-3009 deposit, vouchers, claim, sweep and cooperative refund, each amount exact, the payer
//   paying no gas; forged and over-balance vouchers refused;
// - what the contract itself refuses: over-ceiling, over-balance, forged and mis-authorised claim
//   rows, a replayed refund, a deposit authorisation moved to another channel, a collector called
//   by anyone but the escrow; a lower claim changes nothing;
// - one multicall carrying claim batches of two authorizers and the sweeps, all or nothing;
// - without a payer authorizer, vouchers signed by the payer: an EOA, or a smart wallet (ERC-1271);
// - a Permit2 deposit, and the payer's timed withdrawal (last: it moves the chain's clock on).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  BaseError, ContractFunctionRevertedError, encodeAbiParameters, encodeFunctionData, hashTypedData, isAddressEqual, keccak256,
  parseEventLogs, toHex, zeroAddress,
} from 'viem';
import { toClientEvmSigner, toFacilitatorEvmSigner, voucherTypes } from '@x402/evm';
import { BatchSettlementEvmScheme as BatchClient } from '@x402/evm/batch-settlement/client';
import { BatchSettlementEvmScheme as BatchFacilitator } from '@x402/evm/batch-settlement/facilitator';
import { startAnvil } from './lib/anvil.mjs';
import { ERC1271_ALWAYS_INVALID, ERC1271_ALWAYS_VALID } from './lib/wallets.mjs';
import { anvilKey, freshAccount, ROLE } from './lib/accounts.mjs';
import { deployUsdc, mintUsdc, usdcAbi, USDC_EIP712, walletFor } from './lib/deploy-usdc.mjs';
import { approvePermit2, placePermit2 } from './lib/permit2.mjs';
import {
  BATCH_SETTLEMENT, ERC3009_COLLECTOR, PERMIT2_COLLECTOR, batchSettlementAbi, batchSettlementDomain, channelConfig,
  claimArgs, compileBatchSettlement, computeChannelId, officialBatchSettlementAbi, placeBatchSettlement, readChannel,
  readReceiver, signClaimBatch, signRefund, signVoucher,
} from './lib/batch-settlement.mjs';

const CHAIN_ID = 84532;
const NETWORK = `eip155:${CHAIN_ID}`;
const FUNDS = 1_000_000n;
const PRICE = 1000n;
// @x402/evm's client deposits 5 prices when no policy says otherwise.
const DEPOSIT = 5n * PRICE;

let anvil;
let deployer;
let relayer; // the facilitator's signer: pays the gas of every escrow transaction
let usdc;
let facilitator;
const authorizer = freshAccount(); // the receiver authorizer: a test key, not a transaction signer

before(async () => {
  anvil = await startAnvil({ chainId: CHAIN_ID });
  deployer = await walletFor(anvil.url, anvilKey(ROLE.deployer));
  relayer = await walletFor(anvil.url, anvilKey(ROLE.signer));
  usdc = await deployUsdc(deployer);
  await placeBatchSettlement(deployer);
  await placePermit2(deployer);
  facilitator = new BatchFacilitator(toFacilitatorEvmSigner({ ...relayer, address: relayer.account.address }), authorizer);
});

after(async () => {
  await anvil?.stop();
});

const abi = () => batchSettlementAbi();
const balanceOf = (address) => deployer.readContract({ address: usdc, abi: usdcAbi, functionName: 'balanceOf', args: [address] });

/** Payment requirements as an @x402/evm batch-settlement server announces them. */
function requirements(receiver, extra = {}) {
  return {
    scheme: 'batch-settlement', network: NETWORK, amount: String(PRICE), asset: usdc, payTo: receiver,
    // An hour, as the binding's example: deposit authorisations stay valid after the timed
    // withdrawal test moves the chain's clock past the withdraw delay.
    maxTimeoutSeconds: 3600,
    extra: { receiverAuthorizer: authorizer.address, withdrawDelay: 900, ...USDC_EIP712, ...extra },
  };
}

/** The requirements the official channel manager sends with claim, settle and refund payloads. */
function managerRequirements(receiver) {
  return { scheme: 'batch-settlement', network: NETWORK, asset: usdc, amount: '0', payTo: receiver, maxTimeoutSeconds: 0, extra: {} };
}

/** A fresh payer with FUNDS of USDC (and no ETH) and its official client scheme. */
async function newPayer() {
  const account = freshAccount();
  await mintUsdc(deployer, usdc, account.address, FUNDS);
  return { account, client: new BatchClient(toClientEvmSigner(account, deployer)) };
}

/**
 * The client's next payment payload for `reqs`; `charged` tells the client, as the resource
 * server's answer would, that the request was charged the full price.
 */
async function pay(client, reqs) {
  const { payload } = await client.createPaymentPayload(2, reqs);
  const paymentPayload = { x402Version: 2, accepted: reqs, payload };
  const charged = () => client.schemeHooks.onPaymentResponse({
    settleResponse: { success: true, extra: { chargedAmount: String(PRICE) } }, paymentPayload, requirements: reqs,
  });
  return { paymentPayload, payload, charged };
}

/** Sends the call from `client`'s account, or from `account` (a local account with ETH) through it. */
async function send(client, functionName, args, { account } = {}) {
  const hash = await client.writeContract({ address: BATCH_SETTLEMENT, abi: abi(), functionName, args, ...(account && { account }) });
  const receipt = await client.waitForTransactionReceipt({ hash });
  assert.equal(receipt.status, 'success', `${functionName} reverted`);
  return receipt;
}

/** The name of the error the call reverts with (it must revert), or its message for a require. */
async function revertName(client, functionName, args, { address = BATCH_SETTLEMENT, callAbi = abi(), account } = {}) {
  try {
    await client.simulateContract({ address, abi: callAbi, functionName, args, ...(account && { account }) });
  } catch (err) {
    const reverted = err instanceof BaseError && err.walk((e) => e instanceof ContractFunctionRevertedError);
    if (!reverted) throw err;
    if (!reverted.data) return reverted.reason ?? reverted.signature;
    return reverted.data.errorName === 'Error' ? reverted.data.args[0] : reverted.data.errorName;
  }
  assert.fail(`${functionName} did not revert`);
}

/** The escrow's events in transaction `hash`, as [name, args] in order. */
async function escrowEvents(hash) {
  const receipt = await deployer.getTransactionReceipt({ hash });
  const logs = receipt.logs.filter((log) => isAddressEqual(log.address, BATCH_SETTLEMENT));
  return parseEventLogs({ abi: abi(), logs }).map(({ eventName, args }) => [eventName, args]);
}

/** An ABI entry as comparable text: keys sorted, without Solidity's internalType names. */
function abiShape(entry) {
  const canonical = (value) => {
    if (Array.isArray(value)) return value.map(canonical);
    if (value === null || typeof value !== 'object') return value;
    const keys = Object.keys(value).filter((key) => key !== 'internalType').sort();
    return Object.fromEntries(keys.map((key) => [key, canonical(value[key])]));
  };
  return JSON.stringify(canonical(entry));
}

/** A claim row as the `claim` payload carries it. */
const row = (channel, maxClaimableAmount, signature, totalClaimed = maxClaimableAmount) => ({
  voucher: { channel, maxClaimableAmount: String(maxClaimableAmount) }, signature, totalClaimed: String(totalClaimed),
});

test('the escrow has every entry of @x402/evm\'s batch-settlement ABI, and hashes as it does', async () => {
  const ours = new Set(abi().map(abiShape));
  const theirs = await officialBatchSettlementAbi();
  assert.ok(theirs.length >= 19, `only ${theirs.length} entries in @x402/evm's ABI`);
  for (const entry of theirs) assert.ok(ours.has(abiShape(entry)), `missing or different: ${abiShape(entry)}`);

  const config = channelConfig({
    payer: freshAccount().address, receiver: freshAccount().address, receiverAuthorizer: authorizer.address,
    token: usdc, salt: keccak256(toHex('salt')),
  });
  const read = (functionName, args = []) => deployer.readContract({ address: BATCH_SETTLEMENT, abi: abi(), functionName, args });
  const channelId = computeChannelId(config, CHAIN_ID);
  assert.equal(await read('getChannelId', [config]), channelId);
  assert.equal(await read('CHANNEL_CONFIG_TYPEHASH'), keccak256(toHex(
    'ChannelConfig(address payer,address payerAuthorizer,address receiver,address receiverAuthorizer,address token,uint40 withdrawDelay,bytes32 salt)',
  )));
  const voucherDigest = hashTypedData({
    domain: batchSettlementDomain(CHAIN_ID), types: voucherTypes, primaryType: 'Voucher',
    message: { channelId, maxClaimableAmount: 1234n },
  });
  assert.equal(await read('getVoucherDigest', [channelId, 1234n]), voucherDigest);
  const [, name, version, chainId, verifyingContract] = await read('eip712Domain');
  assert.deepEqual([name, version, Number(chainId), verifyingContract], ['x402 Batch Settlement', '1', CHAIN_ID, BATCH_SETTLEMENT]);
  for (const [address, collector] of [[ERC3009_COLLECTOR, 'erc3009Collector'], [PERMIT2_COLLECTOR, 'permit2Collector']]) {
    const collectorAbi = compileBatchSettlement()[collector].abi;
    assert.equal(await deployer.readContract({ address, abi: collectorAbi, functionName: 'x402BatchSettlement' }), BATCH_SETTLEMENT);
  }
});

test('ERC-3009 deposit, vouchers, claim, sweep and refund through the official schemes move exact amounts', async () => {
  const { account: payer, client } = await newPayer();
  const receiver = freshAccount().address;
  const reqs = requirements(receiver);
  const escrowBefore = await balanceOf(BATCH_SETTLEMENT);

  // The first payment deposits through the ERC-3009 collector; the relayer pays the gas.
  const first = await pay(client, reqs);
  assert.equal(first.payload.type, 'deposit');
  assert.equal(BigInt(first.payload.deposit.amount), DEPOSIT);
  const checked = await facilitator.verify(first.paymentPayload, reqs);
  assert.equal(checked.isValid, true, checked.invalidReason);
  const deposited = await facilitator.settle(first.paymentPayload, reqs);
  assert.equal(deposited.success, true, `${deposited.errorReason}: ${deposited.errorMessage}`);
  assert.equal(deposited.amount, String(DEPOSIT));
  assert.equal(deposited.extra.channelState.balance, String(DEPOSIT));
  await first.charged();
  assert.equal(await balanceOf(BATCH_SETTLEMENT), escrowBefore + DEPOSIT);
  assert.equal(await balanceOf(payer.address), FUNDS - DEPOSIT);
  const config = first.payload.channelConfig;
  const channelId = first.payload.voucher.channelId;
  assert.equal(channelId, computeChannelId(config, CHAIN_ID));
  assert.deepEqual(await readChannel(deployer, channelId), {
    balance: DEPOSIT, totalClaimed: 0n, withdrawRequestedAt: 0, withdrawAmount: 0n, refundNonce: 0n,
  });
  const sender = relayer.account.address;
  assert.deepEqual(await escrowEvents(deposited.transaction), [
    ['ChannelCreated', { channelId, config }],
    ['Deposited', { channelId, sender, amount: DEPOSIT, newBalance: DEPOSIT }],
  ]);

  // Three more requests paid by voucher, each verified against the channel.
  const vouchers = [first.payload.voucher];
  for (let i = 2; i <= 4; i += 1) {
    const next = await pay(client, reqs);
    assert.equal(next.payload.type, 'voucher');
    assert.equal(next.payload.voucher.maxClaimableAmount, String(BigInt(i) * PRICE));
    const verdict = await facilitator.verify(next.paymentPayload, reqs);
    assert.equal(verdict.isValid, true, verdict.invalidReason);
    assert.deepEqual(verdict.extra, { channelId, balance: String(DEPOSIT), totalClaimed: '0', withdrawRequestedAt: 0, refundNonce: '0' });
    await next.charged();
    vouchers.push(next.payload.voucher);
  }

  // A voucher signed by someone else, one whose amount was raised after signing, one above the balance.
  const voucherPayload = (voucher) => ({ x402Version: 2, accepted: reqs, payload: { type: 'voucher', channelConfig: config, voucher } });
  const forged = await signVoucher(freshAccount(), channelId, String(5n * PRICE), NETWORK);
  const raised = { ...vouchers[3], maxClaimableAmount: String(5n * PRICE) };
  const overBalance = await signVoucher(payer, channelId, String(DEPOSIT + 1n), NETWORK);
  for (const [voucher, reason] of [
    [forged, 'invalid_batch_settlement_evm_voucher_signature'],
    [raised, 'invalid_batch_settlement_evm_voucher_signature'],
    [overBalance, 'invalid_batch_settlement_evm_cumulative_exceeds_balance'],
  ]) {
    const verdict = await facilitator.verify(voucherPayload(voucher), reqs);
    assert.equal(verdict.isValid, false);
    assert.equal(verdict.invalidReason, reason);
  }

  // The server claims the third voucher (the facilitator signs the ClaimBatch with the authorizer key).
  const manager = managerRequirements(receiver);
  const claimPayload = { type: 'claim', claims: [row(config, 3n * PRICE, vouchers[2].signature)] };
  const claimed = await facilitator.settle({ x402Version: 2, accepted: manager, payload: claimPayload }, manager);
  assert.equal(claimed.success, true, `${claimed.errorReason}: ${claimed.errorMessage}`);
  assert.equal((await readChannel(deployer, channelId)).totalClaimed, 3n * PRICE);
  assert.deepEqual(await readReceiver(deployer, receiver, usdc), { totalClaimed: 3n * PRICE, totalSettled: 0n });
  assert.deepEqual(await escrowEvents(claimed.transaction), [
    ['Claimed', { channelId, sender, claimAmount: 3n * PRICE, newTotalClaimed: 3n * PRICE }],
  ]);

  // The sweep sends the receiver exactly what was claimed; a second one has nothing to send.
  const settlePayload = { x402Version: 2, accepted: manager, payload: { type: 'settle', receiver, token: usdc } };
  const swept = await facilitator.settle(settlePayload, manager);
  assert.equal(swept.success, true, `${swept.errorReason}: ${swept.errorMessage}`);
  assert.equal(swept.amount, String(3n * PRICE));
  assert.equal(await balanceOf(receiver), 3n * PRICE);
  assert.deepEqual(await escrowEvents(swept.transaction), [['Settled', { receiver, token: usdc, sender, amount: 3n * PRICE }]]);
  const again = await facilitator.settle(settlePayload, manager);
  assert.equal(again.success, false);
  assert.equal(again.errorReason, 'invalid_batch_settlement_evm_nothing_to_settle');

  // Cooperative refund of the rest: the fourth voucher is claimed and the unclaimed escrow returned
  // in one multicall (claimWithSignature, refundWithSignature), both signed by the authorizer key.
  const refundVoucher = await signVoucher(payer, channelId, String(4n * PRICE), NETWORK);
  const refundRequest = { x402Version: 2, accepted: reqs, payload: { type: 'refund', channelConfig: config, voucher: refundVoucher } };
  const refundVerdict = await facilitator.verify(refundRequest, reqs);
  assert.equal(refundVerdict.isValid, true, refundVerdict.invalidReason);
  const rest = DEPOSIT - 4n * PRICE;
  const refundPayload = {
    type: 'refund', channelConfig: config, voucher: refundVoucher, amount: String(rest), refundNonce: '0',
    claims: [row(config, 4n * PRICE, refundVoucher.signature)],
  };
  const refunded = await facilitator.settle({ x402Version: 2, accepted: manager, payload: refundPayload }, manager);
  assert.equal(refunded.success, true, `${refunded.errorReason}: ${refunded.errorMessage}`);
  assert.equal(refunded.amount, String(rest));
  assert.deepEqual(await escrowEvents(refunded.transaction), [
    ['Claimed', { channelId, sender, claimAmount: PRICE, newTotalClaimed: 4n * PRICE }],
    ['Refunded', { channelId, sender, amount: rest }],
  ]);
  assert.equal(await balanceOf(payer.address), FUNDS - 4n * PRICE);
  assert.deepEqual(await readChannel(deployer, channelId), {
    balance: 4n * PRICE, totalClaimed: 4n * PRICE, withdrawRequestedAt: 0, withdrawAmount: 0n, refundNonce: 1n,
  });
  const last = await facilitator.settle(settlePayload, manager);
  assert.equal(last.amount, String(PRICE));
  assert.equal(await balanceOf(receiver), 4n * PRICE);
  assert.equal(await balanceOf(BATCH_SETTLEMENT), escrowBefore);

  // The payer never sent a transaction nor held ETH.
  assert.equal(await deployer.getTransactionCount({ address: payer.address }), 0);
  assert.equal(await deployer.getBalance({ address: payer.address }), 0n);
});

/**
 * A channel funded with DEPOSIT through the ERC-3009 collector by the official schemes:
 * {payer, receiver, config, channelId}; `receiverAuthorizer` another authorizer's address.
 */
async function fundedChannel({ receiverAuthorizer = authorizer.address } = {}) {
  const { account: payer, client } = await newPayer();
  const receiver = freshAccount().address;
  const reqs = requirements(receiver, { receiverAuthorizer });
  const { paymentPayload, payload } = await pay(client, reqs);
  const settled = await facilitator.settle(paymentPayload, reqs);
  assert.equal(settled.success, true, `${settled.errorReason}: ${settled.errorMessage}`);
  return { payer, receiver, config: payload.channelConfig, channelId: payload.voucher.channelId };
}

test('the escrow refuses claims beyond the voucher or the balance, forged or mis-authorised; a lower claim is a no-op', async () => {
  const { payer, config, channelId } = await fundedChannel();
  const voucher = (amount, signer = payer) => signVoucher(signer, channelId, String(amount), NETWORK);
  const claimed = async (rows, signer = authorizer) => [claimArgs(rows), await signClaimBatch(signer, CHAIN_ID, rows)];

  const v2 = await voucher(2n * PRICE);
  assert.equal(await revertName(relayer, 'claimWithSignature', await claimed([row(config, 2n * PRICE, v2.signature, 2n * PRICE + 1n)])), 'ClaimExceedsCeiling');
  const vOver = await voucher(DEPOSIT + 1n);
  assert.equal(await revertName(relayer, 'claimWithSignature', await claimed([row(config, DEPOSIT + 1n, vOver.signature)])), 'ClaimExceedsBalance');
  const vForged = await voucher(2n * PRICE, freshAccount());
  assert.equal(await revertName(relayer, 'claimWithSignature', await claimed([row(config, 2n * PRICE, vForged.signature)])), 'InvalidSignature');
  assert.equal(await revertName(relayer, 'claimWithSignature', await claimed([row(config, 2n * PRICE, v2.signature)], freshAccount())), 'InvalidSignature');
  const other = { ...config, receiverAuthorizer: freshAccount().address };
  assert.equal(await revertName(relayer, 'claimWithSignature', await claimed([row(config, 2n * PRICE, v2.signature), row(other, PRICE, v2.signature)])), 'NotReceiverAuthorizer');
  assert.equal(await revertName(relayer, 'claim', [claimArgs([row(config, 2n * PRICE, v2.signature)])]), 'NotAuthorizedToClaim');
  assert.equal(await revertName(relayer, 'claimWithSignature', [[], '0x']), 'EmptyBatch');
  assert.equal((await readChannel(deployer, channelId)).totalClaimed, 0n);

  // A valid claim, then a lower one: totalClaimed stays where it was.
  await send(relayer, 'claimWithSignature', await claimed([row(config, 2n * PRICE, v2.signature)]));
  const v1 = await voucher(PRICE);
  await send(relayer, 'claimWithSignature', await claimed([row(config, PRICE, v1.signature)]));
  assert.equal((await readChannel(deployer, channelId)).totalClaimed, 2n * PRICE);

  // A signed refund is good once: the nonce moves on, so its replay is refused.
  const refundArgs = [config, PRICE, 0n, await signRefund(authorizer, CHAIN_ID, channelId, 0n, PRICE)];
  assert.equal(await revertName(relayer, 'refundWithSignature', [config, PRICE + 1n, 0n, refundArgs[3]]), 'InvalidSignature');
  await send(relayer, 'refundWithSignature', refundArgs);
  assert.equal(await revertName(relayer, 'refundWithSignature', refundArgs), 'InvalidRefundNonce');
  assert.equal(await balanceOf(payer.address), FUNDS - DEPOSIT + PRICE);
  const state = await readChannel(deployer, channelId);
  assert.deepEqual([state.balance, state.totalClaimed, state.refundNonce], [DEPOSIT - PRICE, 2n * PRICE, 1n]);
});

test('a deposit authorisation funds only its own channel, and only the escrow may make a collector pull', async () => {
  const { account: payer, client } = await newPayer();
  const reqs = requirements(freshAccount().address);
  const { payload } = await pay(client, reqs);
  const auth = payload.deposit.authorization.erc3009Authorization;
  const collectorData = encodeAbiParameters(
    [{ type: 'uint256' }, { type: 'uint256' }, { type: 'uint256' }, { type: 'bytes' }],
    [BigInt(auth.validAfter), BigInt(auth.validBefore), BigInt(auth.salt), auth.signature],
  );
  const elsewhere = { ...payload.channelConfig, salt: keccak256(toHex('another channel')) };
  assert.equal(await revertName(relayer, 'deposit', [elsewhere, DEPOSIT, ERC3009_COLLECTOR, collectorData]), 'FiatTokenV2: invalid signature');
  const collectorAbi = compileBatchSettlement().erc3009Collector.abi;
  assert.equal(await revertName(
    relayer, 'collect', [payer.address, usdc, DEPOSIT, payload.voucher.channelId, collectorData],
    { address: ERC3009_COLLECTOR, callAbi: collectorAbi },
  ), 'OnlyX402BatchSettlement');
  // The same data with its own channel goes through.
  await send(relayer, 'deposit', [payload.channelConfig, DEPOSIT, ERC3009_COLLECTOR, collectorData]);
  assert.equal((await readChannel(deployer, payload.voucher.channelId)).balance, DEPOSIT);
});

test('one multicall carries claim batches of different authorizers and the sweeps; a failing call fails it all', async () => {
  const other = freshAccount();
  const a = await fundedChannel();
  const b = await fundedChannel({ receiverAuthorizer: other.address });
  const rowA = row(a.config, 2n * PRICE, (await signVoucher(a.payer, a.channelId, String(2n * PRICE), NETWORK)).signature);
  const rowB = row(b.config, 3n * PRICE, (await signVoucher(b.payer, b.channelId, String(3n * PRICE), NETWORK)).signature);
  const call = (functionName, args) => encodeFunctionData({ abi: abi(), functionName, args });
  const claimCall = async (rows, signer) => call('claimWithSignature', [claimArgs(rows), await signClaimBatch(signer, CHAIN_ID, rows)]);
  const calls = [
    await claimCall([rowA], authorizer), await claimCall([rowB], other),
    call('settle', [a.receiver, usdc]), call('settle', [b.receiver, usdc]),
  ];

  const overCeiling = await claimCall([{ ...rowB, totalClaimed: String(3n * PRICE + 1n) }], other);
  assert.equal(await revertName(relayer, 'multicall', [[calls[0], overCeiling, calls[2]]]), 'ClaimExceedsCeiling');
  assert.equal((await readChannel(deployer, a.channelId)).totalClaimed, 0n);

  await send(relayer, 'multicall', [calls]);
  assert.equal(await balanceOf(a.receiver), 2n * PRICE);
  assert.equal(await balanceOf(b.receiver), 3n * PRICE);
  assert.equal((await readChannel(deployer, a.channelId)).totalClaimed, 2n * PRICE);
  assert.equal((await readChannel(deployer, b.channelId)).totalClaimed, 3n * PRICE);
  assert.deepEqual(await readReceiver(deployer, b.receiver, usdc), { totalClaimed: 3n * PRICE, totalSettled: 3n * PRICE });
});

test('with no payer authorizer the payer signs vouchers: an EOA by ECDSA, a smart wallet by ERC-1271', async () => {
  // An EOA payer through the official schemes, its client told to commit no payer authorizer.
  const account = freshAccount();
  await mintUsdc(deployer, usdc, account.address, FUNDS);
  const client = new BatchClient(toClientEvmSigner(account, deployer), { payerAuthorizer: zeroAddress });
  const receiver = freshAccount().address;
  const reqs = requirements(receiver);
  const first = await pay(client, reqs);
  assert.equal(first.payload.channelConfig.payerAuthorizer, zeroAddress);
  const deposited = await facilitator.settle(first.paymentPayload, reqs);
  assert.equal(deposited.success, true, `${deposited.errorReason}: ${deposited.errorMessage}`);
  await first.charged();
  const second = await pay(client, reqs);
  const verdict = await facilitator.verify(second.paymentPayload, reqs);
  assert.equal(verdict.isValid, true, verdict.invalidReason);
  const { channelConfig: config, voucher } = second.payload;
  const forged = await signVoucher(freshAccount(), voucher.channelId, voucher.maxClaimableAmount, NETWORK);
  const refused = await facilitator.verify({ ...second.paymentPayload, payload: { ...second.payload, voucher: forged } }, reqs);
  assert.equal(refused.invalidReason, 'invalid_batch_settlement_evm_voucher_signature');
  const claimed = async (rows) => [claimArgs(rows), await signClaimBatch(authorizer, CHAIN_ID, rows)];
  assert.equal(await revertName(relayer, 'claimWithSignature', await claimed([row(config, 2n * PRICE, forged.signature)])), 'InvalidSignature');
  await send(relayer, 'claimWithSignature', await claimed([row(config, 2n * PRICE, voucher.signature)]));
  assert.equal((await readChannel(deployer, voucher.channelId)).totalClaimed, 2n * PRICE);

  // A smart-wallet payer: the escrow asks the wallet (ERC-1271), whatever the signature bytes.
  const wallet = freshAccount().address;
  await anvil.rpc('anvil_setCode', [wallet, ERC1271_ALWAYS_VALID]);
  await mintUsdc(deployer, usdc, wallet, FUNDS);
  const walletConfig = channelConfig({
    payer: wallet, payerAuthorizer: zeroAddress, receiver, receiverAuthorizer: authorizer.address, token: usdc,
  });
  const walletChannel = computeChannelId(walletConfig, CHAIN_ID);
  const anySignature = `0x${'11'.repeat(65)}`;
  const collectorData = encodeAbiParameters(
    [{ type: 'uint256' }, { type: 'uint256' }, { type: 'uint256' }, { type: 'bytes' }],
    [0n, BigInt(Math.floor(Date.now() / 1000) + 3600), 7n, anySignature],
  );
  await send(relayer, 'deposit', [walletConfig, DEPOSIT, ERC3009_COLLECTOR, collectorData]);
  await anvil.rpc('anvil_setCode', [wallet, ERC1271_ALWAYS_INVALID]);
  const walletRow = row(walletConfig, PRICE, anySignature);
  assert.equal(await revertName(relayer, 'claimWithSignature', await claimed([walletRow])), 'InvalidSignature');
  await anvil.rpc('anvil_setCode', [wallet, ERC1271_ALWAYS_VALID]);
  await send(relayer, 'claimWithSignature', await claimed([walletRow]));
  assert.equal((await readChannel(deployer, walletChannel)).totalClaimed, PRICE);
});

test('a Permit2 deposit through the official schemes, then the payer\'s timed withdrawal', async () => {
  const { account: payer, client } = await newPayer();
  await anvil.rpc('anvil_setBalance', [payer.address, '0xde0b6b3a7640000']);
  await approvePermit2(payer, deployer, usdc);
  const reqs = requirements(freshAccount().address, { assetTransferMethod: 'permit2' });
  const escrowBefore = await balanceOf(BATCH_SETTLEMENT);

  const { paymentPayload, payload } = await pay(client, reqs);
  assert.ok(payload.deposit.authorization.permit2Authorization, 'the client signed no Permit2 deposit');
  assert.equal(payload.deposit.authorization.permit2Authorization.spender, PERMIT2_COLLECTOR);
  const verdict = await facilitator.verify(paymentPayload, reqs);
  assert.equal(verdict.isValid, true, verdict.invalidReason);
  const settled = await facilitator.settle(paymentPayload, reqs);
  assert.equal(settled.success, true, `${settled.errorReason}: ${settled.errorMessage}`);
  assert.equal(await balanceOf(BATCH_SETTLEMENT), escrowBefore + DEPOSIT);
  const { channelConfig: config, voucher: { channelId } } = payload;
  assert.equal((await readChannel(deployer, channelId)).balance, DEPOSIT);
  // The same authorisation again: Permit2's nonce is spent.
  const replay = await facilitator.settle(paymentPayload, reqs);
  assert.equal(replay.success, false);
  assert.equal(await balanceOf(BATCH_SETTLEMENT), escrowBefore + DEPOSIT);

  // Timed withdrawal: not before the delay, then exactly the amount asked.
  const asPayer = { account: payer };
  assert.equal(await revertName(deployer, 'initiateWithdraw', [config, PRICE]), 'InvalidChannel');
  assert.equal(await revertName(deployer, 'initiateWithdraw', [config, DEPOSIT + 1n], asPayer), 'WithdrawAmountExceedsAvailable');
  await send(deployer, 'initiateWithdraw', [config, 2n * PRICE], asPayer);
  const pending = await readChannel(deployer, channelId);
  assert.ok(pending.withdrawRequestedAt > 0);
  assert.equal(pending.withdrawAmount, 2n * PRICE);
  const funds = await balanceOf(payer.address);
  assert.equal(await revertName(deployer, 'finalizeWithdraw', [config], asPayer), 'WithdrawDelayNotElapsed');
  await anvil.rpc('evm_increaseTime', [900]);
  await anvil.mine();
  await send(deployer, 'finalizeWithdraw', [config], asPayer);
  assert.equal(await balanceOf(payer.address), funds + 2n * PRICE);
  assert.deepEqual(await readChannel(deployer, channelId), {
    balance: DEPOSIT - 2n * PRICE, totalClaimed: 0n, withdrawRequestedAt: 0, withdrawAmount: 0n, refundNonce: 0n,
  });
});
