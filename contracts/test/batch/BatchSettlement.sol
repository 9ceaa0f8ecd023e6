// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.26;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {Multicall} from "@openzeppelin/contracts/utils/Multicall.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MessageHashUtils} from "@openzeppelin/contracts/utils/cryptography/MessageHashUtils.sol";
import {SignatureChecker} from "@openzeppelin/contracts/utils/cryptography/SignatureChecker.sol";

// What a deposit collector offers the settlement contract: pull `amount` of `token` from `payer`
// into the settlement contract, authorised by `collectorData` (whose layout is the collector's).
interface IDepositCollector {
    function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes calldata collectorData)
        external;
}

// For routerd's end-to-end tests only: the escrow contract of the x402 `batch-settlement` scheme on
// EVM, written for routerd from the scheme's EVM binding
// (specs/schemes/batch-settlement/scheme_batch_settlement_evm.md). Its functions, return shapes,
// events and EIP-712 domain and types are those @x402/evm 2.27.0 calls and signs, so that the
// official client, server and facilitator, and routerd, run against it at the canonical address
// 0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003.
//
// A payer deposits into a channel (identified by the EIP-712 hash of its immutable config) and pays
// by cumulative vouchers; the receiver side claims the latest vouchers (accounting only) and sweeps
// what it claimed with `settle`; unclaimed escrow goes back by cooperative refund or, unilaterally,
// by a timed withdrawal.
//
// The tests place the runtime code with anvil_setCode, so nothing may depend on a constructor:
// the EIP-712 domain separator is computed from block.chainid and address(this) on every use, and
// the reentrancy guard lives in transient storage (cancun), which every transaction starts empty.
contract x402BatchSettlement is Multicall, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    struct ChannelConfig {
        address payer;
        address payerAuthorizer; // the voucher signer (ECDSA); zero: the payer signs (ECDSA or ERC-1271)
        address receiver;
        address receiverAuthorizer; // signs claim batches and refunds; never zero
        address token;
        uint40 withdrawDelay;
        bytes32 salt;
    }

    // `balance`: deposited minus refunded and withdrawn. `totalClaimed`: cumulative, only grows.
    // Claimed funds stay counted in `balance` after they are swept: what the payer may still get
    // back is `balance - totalClaimed`.
    struct ChannelState {
        uint128 balance;
        uint128 totalClaimed;
    }

    struct WithdrawalState {
        uint128 amount;
        uint40 initiatedAt; // zero: none pending
    }

    struct ReceiverState {
        uint128 totalClaimed;
        uint128 totalSettled;
    }

    struct Voucher {
        ChannelConfig channel;
        uint128 maxClaimableAmount;
    }

    // A payer-signed voucher and the cumulative amount claimed under it (a total, not a delta, so a
    // replayed row changes nothing).
    struct VoucherClaim {
        Voucher voucher;
        bytes signature;
        uint128 totalClaimed;
    }

    uint40 public constant MIN_WITHDRAW_DELAY = 15 minutes;
    uint40 public constant MAX_WITHDRAW_DELAY = 30 days;

    bytes32 private constant DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    bytes32 private constant NAME_HASH = keccak256("x402 Batch Settlement");
    bytes32 private constant VERSION_HASH = keccak256("1");

    bytes32 public constant CHANNEL_CONFIG_TYPEHASH = keccak256(
        "ChannelConfig(address payer,address payerAuthorizer,address receiver,address receiverAuthorizer,address token,uint40 withdrawDelay,bytes32 salt)"
    );
    bytes32 public constant VOUCHER_TYPEHASH = keccak256("Voucher(bytes32 channelId,uint128 maxClaimableAmount)");
    bytes32 public constant REFUND_TYPEHASH = keccak256("Refund(bytes32 channelId,uint256 nonce,uint128 amount)");
    bytes32 public constant CLAIM_ENTRY_TYPEHASH =
        keccak256("ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)");
    bytes32 public constant CLAIM_BATCH_TYPEHASH = keccak256(
        "ClaimBatch(ClaimEntry[] claims)ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)"
    );

    mapping(bytes32 channelId => ChannelState) public channels;
    // The nonce the next `refundWithSignature` must carry; every executed refund (direct or signed)
    // advances it, before anything else happens.
    mapping(bytes32 channelId => uint256) public refundNonce;
    mapping(bytes32 channelId => WithdrawalState) public pendingWithdrawals;
    mapping(address receiver => mapping(address token => ReceiverState)) public receivers;

    event ChannelCreated(bytes32 indexed channelId, ChannelConfig config);
    event ChannelClosed(bytes32 indexed channelId, ChannelConfig config);
    event Deposited(bytes32 indexed channelId, address indexed sender, uint128 amount, uint128 newBalance);
    event Claimed(bytes32 indexed channelId, address indexed sender, uint128 claimAmount, uint128 newTotalClaimed);
    event Settled(address indexed receiver, address indexed token, address indexed sender, uint128 amount);
    event Refunded(bytes32 indexed channelId, address indexed sender, uint128 amount);
    event WithdrawInitiated(bytes32 indexed channelId, uint128 amount, uint40 finalizeAfter);
    event WithdrawFinalized(bytes32 indexed channelId, address indexed sender, uint128 amount);

    // The revert reasons carry the names the scheme's deployed contract uses, so that one decoder
    // reads both.
    error InvalidChannel();
    error ZeroDeposit();
    error DepositOverflow();
    error InvalidSignature();
    error NotReceiverAuthorizer();
    error NotAuthorizedToClaim();
    error NotAuthorizedToRefund();
    error ClaimExceedsCeiling();
    error ClaimExceedsBalance();
    error WithdrawalAlreadyPending();
    error WithdrawalNotPending();
    error NotAuthorizedToFinalizeWithdraw();
    error WithdrawDelayNotElapsed();
    error NothingToWithdraw();
    error WithdrawAmountExceedsAvailable();
    error WithdrawDelayOutOfRange();
    error EmptyBatch();
    error DepositCollectionFailed();
    error InvalidCollector();
    error InvalidRefundNonce();
    error ZeroRefund();

    // ---------------------------------------------------------------- deposit

    // Credits `amount` to the channel of `config` (creating it), pulled from the payer by
    // `collector` with `collectorData`. The contract's token balance must grow by exactly `amount`,
    // whatever the collector does.
    function deposit(ChannelConfig calldata config, uint128 amount, address collector, bytes calldata collectorData)
        external
        nonReentrant
    {
        _requireValidConfig(config);
        if (amount == 0) revert ZeroDeposit();
        if (collector == address(0)) revert InvalidCollector();

        bytes32 channelId = getChannelId(config);
        ChannelState storage ch = channels[channelId];
        uint128 before = ch.balance;
        if (amount > type(uint128).max - before) revert DepositOverflow();
        ch.balance = before + amount;

        IERC20 token = IERC20(config.token);
        uint256 held = token.balanceOf(address(this));
        IDepositCollector(collector).collect(config.payer, config.token, amount, channelId, collectorData);
        if (token.balanceOf(address(this)) != held + amount) revert DepositCollectionFailed();

        if (before == 0 && ch.totalClaimed == 0) emit ChannelCreated(channelId, config);
        emit Deposited(channelId, msg.sender, amount, before + amount);
    }

    // ---------------------------------------------------------------- claim and settle

    // Applies voucher claims sent by each row's receiver or receiver authorizer.
    function claim(VoucherClaim[] calldata voucherClaims) external nonReentrant {
        uint256 n = voucherClaims.length;
        if (n == 0) revert EmptyBatch();
        for (uint256 i; i < n; ++i) {
            ChannelConfig calldata c = voucherClaims[i].voucher.channel;
            if (msg.sender != c.receiver && msg.sender != c.receiverAuthorizer) revert NotAuthorizedToClaim();
            _applyClaim(voucherClaims[i]);
        }
    }

    // Applies voucher claims that the rows' common receiver authorizer signed as one EIP-712
    // `ClaimBatch`; anyone may send it.
    function claimWithSignature(VoucherClaim[] calldata voucherClaims, bytes calldata authorizerSignature)
        external
        nonReentrant
    {
        uint256 n = voucherClaims.length;
        if (n == 0) revert EmptyBatch();
        address authorizer = voucherClaims[0].voucher.channel.receiverAuthorizer;
        for (uint256 i = 1; i < n; ++i) {
            if (voucherClaims[i].voucher.channel.receiverAuthorizer != authorizer) revert NotReceiverAuthorizer();
        }
        if (!SignatureChecker.isValidSignatureNow(authorizer, getClaimBatchDigest(voucherClaims), authorizerSignature))
        {
            revert InvalidSignature();
        }
        for (uint256 i; i < n; ++i) {
            _applyClaim(voucherClaims[i]);
        }
    }

    // Sends `receiver` everything claimed for it in `token` and not yet sent; anyone may call it.
    // Nothing to send is not an error (no transfer, no event).
    function settle(address receiver, address token) external nonReentrant {
        ReceiverState storage rs = receivers[receiver][token];
        uint128 due = rs.totalClaimed - rs.totalSettled;
        if (due == 0) return;
        rs.totalSettled = rs.totalClaimed;
        IERC20(token).safeTransfer(receiver, due);
        emit Settled(receiver, token, msg.sender, due);
    }

    // ---------------------------------------------------------------- timed withdrawal

    // Starts the payer's unilateral withdrawal of `amount` (at most the unclaimed escrow now);
    // the receiver side has `withdrawDelay` seconds to claim before it can be finalised.
    function initiateWithdraw(ChannelConfig calldata config, uint128 amount) external nonReentrant {
        if (msg.sender != config.payer && msg.sender != config.payerAuthorizer) revert InvalidChannel();
        if (amount == 0) revert NothingToWithdraw();
        bytes32 channelId = getChannelId(config);
        WithdrawalState storage ws = pendingWithdrawals[channelId];
        if (ws.initiatedAt != 0) revert WithdrawalAlreadyPending();
        ChannelState storage ch = channels[channelId];
        if (amount > ch.balance - ch.totalClaimed) revert WithdrawAmountExceedsAvailable();

        uint40 now_ = uint40(block.timestamp);
        ws.amount = amount;
        ws.initiatedAt = now_;
        emit WithdrawInitiated(channelId, amount, now_ + config.withdrawDelay);
    }

    // Completes a pending withdrawal once its delay has passed, paying out at most what is still
    // unclaimed by then.
    function finalizeWithdraw(ChannelConfig calldata config) external nonReentrant {
        if (msg.sender != config.payer && msg.sender != config.payerAuthorizer) {
            revert NotAuthorizedToFinalizeWithdraw();
        }
        bytes32 channelId = getChannelId(config);
        WithdrawalState storage ws = pendingWithdrawals[channelId];
        uint40 initiatedAt = ws.initiatedAt;
        if (initiatedAt == 0) revert WithdrawalNotPending();
        if (block.timestamp < uint256(initiatedAt) + config.withdrawDelay) revert WithdrawDelayNotElapsed();

        ChannelState storage ch = channels[channelId];
        uint128 unclaimed = ch.balance - ch.totalClaimed;
        uint128 paid = ws.amount < unclaimed ? ws.amount : unclaimed;
        delete pendingWithdrawals[channelId];
        ch.balance -= paid;

        emit WithdrawFinalized(channelId, msg.sender, paid);
        if (ch.balance == 0 && ch.totalClaimed == 0) emit ChannelClosed(channelId, config);
        if (paid != 0) IERC20(config.token).safeTransfer(config.payer, paid);
    }

    // ---------------------------------------------------------------- cooperative refund

    // Returns up to `amount` of unclaimed escrow to the payer, sent by the receiver or its authorizer.
    function refund(ChannelConfig calldata config, uint128 amount) external nonReentrant {
        if (msg.sender != config.receiver && msg.sender != config.receiverAuthorizer) revert NotAuthorizedToRefund();
        _refund(config, getChannelId(config), amount);
    }

    // As `refund`, authorised by the receiver authorizer's EIP-712 `Refund` over the channel, the
    // current refund nonce and `amount`; anyone may send it.
    function refundWithSignature(
        ChannelConfig calldata config,
        uint128 amount,
        uint256 nonce,
        bytes calldata receiverAuthorizerSignature
    ) external nonReentrant {
        bytes32 channelId = getChannelId(config);
        if (nonce != refundNonce[channelId]) revert InvalidRefundNonce();
        bytes32 digest = getRefundDigest(channelId, nonce, amount);
        if (!SignatureChecker.isValidSignatureNow(config.receiverAuthorizer, digest, receiverAuthorizerSignature)) {
            revert InvalidSignature();
        }
        _refund(config, channelId, amount);
    }

    // ---------------------------------------------------------------- views

    // The channel id: the EIP-712 hash of `config` under this contract's domain, so one config
    // names different channels on different chains or deployments.
    function getChannelId(ChannelConfig calldata config) public view returns (bytes32) {
        return _typedDataHash(keccak256(abi.encode(CHANNEL_CONFIG_TYPEHASH, config)));
    }

    function getVoucherDigest(bytes32 channelId, uint128 maxClaimableAmount) public view returns (bytes32) {
        return _typedDataHash(keccak256(abi.encode(VOUCHER_TYPEHASH, channelId, maxClaimableAmount)));
    }

    function getRefundDigest(bytes32 channelId, uint256 nonce, uint128 amount) public view returns (bytes32) {
        return _typedDataHash(keccak256(abi.encode(REFUND_TYPEHASH, channelId, nonce, amount)));
    }

    // The EIP-712 digest of the `ClaimBatch` whose entries are the rows' (channel id,
    // maxClaimableAmount, totalClaimed), in order; an array of structs hashes as the keccak of its
    // members' struct hashes laid end to end.
    function getClaimBatchDigest(VoucherClaim[] calldata voucherClaims) public view returns (bytes32) {
        uint256 n = voucherClaims.length;
        bytes32[] memory entries = new bytes32[](n);
        for (uint256 i; i < n; ++i) {
            VoucherClaim calldata row = voucherClaims[i];
            entries[i] = keccak256(
                abi.encode(
                    CLAIM_ENTRY_TYPEHASH,
                    getChannelId(row.voucher.channel),
                    row.voucher.maxClaimableAmount,
                    row.totalClaimed
                )
            );
        }
        return _typedDataHash(keccak256(abi.encode(CLAIM_BATCH_TYPEHASH, keccak256(abi.encodePacked(entries)))));
    }

    // ERC-5267: the EIP-712 domain (name, version, chain id, verifying contract).
    function eip712Domain()
        external
        view
        returns (
            bytes1 fields,
            string memory name,
            string memory version,
            uint256 chainId,
            address verifyingContract,
            bytes32 salt,
            uint256[] memory extensions
        )
    {
        return (hex"0f", "x402 Batch Settlement", "1", block.chainid, address(this), bytes32(0), new uint256[](0));
    }

    // ---------------------------------------------------------------- internals

    function _requireValidConfig(ChannelConfig calldata config) private pure {
        if (
            config.payer == address(0) || config.receiver == address(0) || config.receiverAuthorizer == address(0)
                || config.token == address(0)
        ) revert InvalidChannel();
        if (config.withdrawDelay < MIN_WITHDRAW_DELAY || config.withdrawDelay > MAX_WITHDRAW_DELAY) {
            revert WithdrawDelayOutOfRange();
        }
    }

    // Raises the channel's totalClaimed to the row's, within the voucher's signed ceiling and the
    // channel's balance; a row at or below what is already claimed is skipped unchecked, which is
    // what makes re-sending a claim harmless.
    function _applyClaim(VoucherClaim calldata row) private {
        ChannelConfig calldata c = row.voucher.channel;
        bytes32 channelId = getChannelId(c);
        ChannelState storage ch = channels[channelId];
        uint128 claimed = ch.totalClaimed;
        uint128 target = row.totalClaimed;
        if (target <= claimed) return;
        if (target > row.voucher.maxClaimableAmount) revert ClaimExceedsCeiling();
        if (target > ch.balance) revert ClaimExceedsBalance();
        if (!_voucherSignedBy(c, getVoucherDigest(channelId, row.voucher.maxClaimableAmount), row.signature)) {
            revert InvalidSignature();
        }

        uint128 delta = target - claimed;
        ch.totalClaimed = target;
        receivers[c.receiver][c.token].totalClaimed += delta;
        emit Claimed(channelId, msg.sender, delta, target);
    }

    // A payer authorizer is an EOA: plain ECDSA recovery. Without one the payer itself signs, which
    // may be a smart wallet (ERC-1271).
    function _voucherSignedBy(ChannelConfig calldata c, bytes32 digest, bytes calldata signature)
        private
        view
        returns (bool)
    {
        if (c.payerAuthorizer != address(0)) {
            (address signer, ECDSA.RecoverError err,) = ECDSA.tryRecover(digest, signature);
            return err == ECDSA.RecoverError.NoError && signer == c.payerAuthorizer;
        }
        return SignatureChecker.isValidSignatureNow(c.payer, digest, signature);
    }

    // The refund nonce moves first, so an executed refund always consumes its authorisation, even
    // when nothing is left to return (then no transfer and no `Refunded`). A pending withdrawal
    // shrinks by what was refunded, and is dropped when the refund covers it.
    function _refund(ChannelConfig calldata config, bytes32 channelId, uint128 amount) private {
        if (amount == 0) revert ZeroRefund();
        unchecked {
            ++refundNonce[channelId];
        }
        ChannelState storage ch = channels[channelId];
        uint128 unclaimed = ch.balance - ch.totalClaimed;
        uint128 paid = amount < unclaimed ? amount : unclaimed;
        if (paid == 0) return;
        ch.balance -= paid;

        WithdrawalState storage ws = pendingWithdrawals[channelId];
        if (ws.initiatedAt != 0) {
            if (paid >= ws.amount) delete pendingWithdrawals[channelId];
            else ws.amount -= paid;
        }

        emit Refunded(channelId, msg.sender, paid);
        if (ch.balance == 0 && ch.totalClaimed == 0) emit ChannelClosed(channelId, config);
        IERC20(config.token).safeTransfer(config.payer, paid);
    }

    // Computed on every use, never cached: the code is placed, not deployed, and the chain id may change.
    function _domainSeparator() private view returns (bytes32) {
        return keccak256(abi.encode(DOMAIN_TYPEHASH, NAME_HASH, VERSION_HASH, block.chainid, address(this)));
    }

    function _typedDataHash(bytes32 structHash) private view returns (bytes32) {
        return MessageHashUtils.toTypedDataHash(_domainSeparator(), structHash);
    }
}
