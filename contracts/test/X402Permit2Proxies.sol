// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.26;

import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {IERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Permit.sol";

/// The part of Uniswap's Permit2 (its SignatureTransfer) that the proxies call.
interface ISignatureTransfer {
    struct TokenPermissions {
        address token;
        uint256 amount;
    }

    struct PermitTransferFrom {
        TokenPermissions permitted;
        uint256 nonce;
        uint256 deadline;
    }

    struct SignatureTransferDetails {
        address to;
        uint256 requestedAmount;
    }

    /// Moves `transferDetails.requestedAmount` (at most `permit.permitted.amount`) of the token from
    /// `owner` to `transferDetails.to`, if `signature` is `owner`'s over the permit, msg.sender as
    /// spender and the witness (`witness` being its EIP-712 struct hash, `witnessTypeString` the tail
    /// of the type); uses the nonce up.
    function permitWitnessTransferFrom(
        PermitTransferFrom calldata permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes32 witness,
        string calldata witnessTypeString,
        bytes calldata signature
    ) external;
}

/// For the end-to-end tests only: what the x402 Permit2 proxies of the `exact` and `upto` schemes
/// share. A payer signs a Permit2 transfer with the proxy as spender and a witness naming the
/// payee; since Permit2 checks the signature over the witness the proxy passes, whoever calls the
/// proxy (the facilitator) cannot send the funds anywhere else.
/// Permit2 is a constant, not a constructor argument, so that the runtime code works wherever it
/// is placed (the tests put it at the proxies' canonical addresses with anvil_setCode). Likewise
/// the reentrancy guard reads an untouched slot as "not entered".
abstract contract X402Permit2Proxy is ReentrancyGuard {
    ISignatureTransfer public constant PERMIT2 = ISignatureTransfer(0x000000000022D473030F116dDEE9F6B43aC78BA3);

    /// An EIP-2612 permit of the payer approving Permit2 (with `value`) on the token.
    struct EIP2612Permit {
        uint256 value;
        uint256 deadline;
        bytes32 r;
        bytes32 s;
        uint8 v;
    }

    event Settled();
    event SettledWithPermit();

    error InvalidDestination();
    error InvalidOwner();
    error InvalidPermit2Address();
    error PaymentTooEarly();
    error Permit2612AmountMismatch();

    /// What Permit2 appends to "PermitWitnessTransferFrom(TokenPermissions permitted,address
    /// spender,uint256 nonce,uint256 deadline," to get the type the payer signed.
    function _witnessTypeString() internal pure virtual returns (string memory);

    /// Has Permit2 move `amount` from `owner` to `to`, the witness's destination; `witness` is the
    /// witness's struct hash, so a `to` or `validAfter` other than the signed ones fails Permit2's
    /// signature check.
    function _settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        address to,
        uint256 validAfter,
        bytes32 witness,
        bytes calldata signature
    ) internal {
        if (owner == address(0)) revert InvalidOwner();
        if (to == address(0)) revert InvalidDestination();
        if (block.timestamp < validAfter) revert PaymentTooEarly();
        // Says why, where a call to an address without code would revert with no reason at all.
        if (address(PERMIT2).code.length == 0) revert InvalidPermit2Address();
        PERMIT2.permitWitnessTransferFrom(
            permit,
            ISignatureTransfer.SignatureTransferDetails({to: to, requestedAmount: amount}),
            owner,
            witness,
            _witnessTypeString(),
            signature
        );
    }

    /// Submits the payer's EIP-2612 permit approving Permit2, so that a payer who never sent an
    /// approval pays in this one transaction. The payer signed it for the permitted amount: another
    /// value would approve what the payer did not agree to.
    function _approvePermit2(address token, address owner, EIP2612Permit calldata p, uint256 permitted) internal {
        if (p.value != permitted) revert Permit2612AmountMismatch();
        // A permit someone already submitted (copied from the mempool) reverts here, yet its
        // allowance is in place: the settlement goes on, and Permit2 refuses it if no allowance is.
        try IERC20Permit(token).permit(owner, address(PERMIT2), p.value, p.deadline, p.v, p.r, p.s) {} catch {}
    }
}

/// The `exact` scheme's proxy: always the whole permitted amount, to the witness's `to`.
contract x402ExactPermit2Proxy is X402Permit2Proxy {
    struct Witness {
        address to;
        uint256 validAfter;
    }

    string public constant WITNESS_TYPE_STRING =
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,uint256 validAfter)";
    bytes32 public constant WITNESS_TYPEHASH = keccak256("Witness(address to,uint256 validAfter)");

    error InvalidAmount();

    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _settleExact(permit, owner, witness, signature);
        emit Settled();
    }

    function settleWithPermit(
        EIP2612Permit calldata permit2612,
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _approvePermit2(permit.permitted.token, owner, permit2612, permit.permitted.amount);
        _settleExact(permit, owner, witness, signature);
        emit SettledWithPermit();
    }

    function _settleExact(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) private {
        // A transfer of nothing would only use up the payer's nonce.
        if (permit.permitted.amount == 0) revert InvalidAmount();
        bytes32 hash = keccak256(abi.encode(WITNESS_TYPEHASH, witness.to, witness.validAfter));
        _settle(permit, permit.permitted.amount, owner, witness.to, witness.validAfter, hash, signature);
    }

    function _witnessTypeString() internal pure override returns (string memory) {
        return WITNESS_TYPE_STRING;
    }
}

/// The `upto` scheme's proxy: the facilitator the payer named in the witness settles any amount up
/// to the permitted one (what the resource turned out to cost), to the witness's `to`.
contract x402UptoPermit2Proxy is X402Permit2Proxy {
    struct Witness {
        address to;
        address facilitator;
        uint256 validAfter;
    }

    string public constant WITNESS_TYPE_STRING =
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,uint256 validAfter)";
    bytes32 public constant WITNESS_TYPEHASH = keccak256("Witness(address to,address facilitator,uint256 validAfter)");

    error AmountExceedsPermitted();
    error UnauthorizedFacilitator();

    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _settleUpto(permit, amount, owner, witness, signature);
        emit Settled();
    }

    function settleWithPermit(
        EIP2612Permit calldata permit2612,
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _approvePermit2(permit.permitted.token, owner, permit2612, permit.permitted.amount);
        _settleUpto(permit, amount, owner, witness, signature);
        emit SettledWithPermit();
    }

    function _settleUpto(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) private {
        // The amount is the facilitator's to choose, so only the one the payer trusted may: anyone
        // else holding the payload could settle a pittance and use the authorisation up.
        if (msg.sender != witness.facilitator) revert UnauthorizedFacilitator();
        if (amount > permit.permitted.amount) revert AmountExceedsPermitted();
        bytes32 hash = keccak256(abi.encode(WITNESS_TYPEHASH, witness.to, witness.facilitator, witness.validAfter));
        _settle(permit, amount, owner, witness.to, witness.validAfter, hash, signature);
    }

    function _witnessTypeString() internal pure override returns (string memory) {
        return WITNESS_TYPE_STRING;
    }
}
