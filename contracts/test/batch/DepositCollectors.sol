// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.26;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {IERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Permit.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {IDepositCollector} from "./BatchSettlement.sol";

// ERC-3009's pull as USDC (FiatTokenV2_2) offers it, with the signature as bytes.
interface IERC3009Receive {
    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes memory signature
    ) external;
}

// The part of Uniswap's Permit2 (SignatureTransfer) the Permit2 collector calls.
interface IPermit2WitnessTransfer {
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

    function permitWitnessTransferFrom(
        PermitTransferFrom calldata permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes32 witness,
        string calldata witnessTypeString,
        bytes calldata signature
    ) external;
}

// For routerd's end-to-end tests only: what both deposit collectors of the x402 `batch-settlement`
// scheme share (written for routerd from the scheme's EVM binding, for the collector data
// @x402/evm 2.27.0 builds). Only the settlement contract may make a collector pull, since a pull
// spends the payer's authorisation: anyone else could otherwise burn it or misroute the funds.
// The settlement contract's address is a constant, not a constructor argument, so that the runtime
// code works where the tests place it with anvil_setCode.
abstract contract SettlementOnlyCollector is IDepositCollector {
    address public constant x402BatchSettlement = 0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003;

    error OnlyX402BatchSettlement();

    modifier onlySettlement() {
        if (msg.sender != x402BatchSettlement) revert OnlyX402BatchSettlement();
        _;
    }
}

// Deposits by ERC-3009 `receiveWithAuthorization` (placed at 0x4020806089470a89826cB9fB1f4059150b550004).
// The payer signs a ReceiveWithAuthorization to this collector (ERC-3009 requires the caller to be
// the recipient) whose nonce is keccak256(abi.encode(channelId, salt)): the authorisation is bound to
// the channel, so it cannot fund another one. The collector then forwards the tokens.
// collectorData = abi.encode(uint256 validAfter, uint256 validBefore, uint256 salt, bytes signature).
contract ERC3009DepositCollector is SettlementOnlyCollector {
    using SafeERC20 for IERC20;

    function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes calldata collectorData)
        external
        onlySettlement
    {
        (uint256 validAfter, uint256 validBefore, uint256 salt, bytes memory signature) =
            abi.decode(collectorData, (uint256, uint256, uint256, bytes));
        bytes32 nonce = keccak256(abi.encode(channelId, salt));
        IERC3009Receive(token).receiveWithAuthorization(
            payer, address(this), amount, validAfter, validBefore, nonce, signature
        );
        IERC20(token).safeTransfer(x402BatchSettlement, amount);
    }
}

// Deposits through Permit2 (placed at 0x4020425FAf3B746C082C2f942b4E5159887B0005): the payer signs a
// PermitWitnessTransferFrom with this collector as spender and the witness DepositWitness(channelId),
// and Permit2 moves the tokens straight to the settlement contract.
// collectorData = abi.encode(uint256 nonce, uint256 deadline, bytes permit2Signature,
// bytes eip2612PermitData), the last empty or abi.encode(uint256 value, uint256 deadline, uint8 v,
// bytes32 r, bytes32 s): the payer's EIP-2612 permit approving Permit2, tried first.
contract Permit2DepositCollector is SettlementOnlyCollector {
    address public constant PERMIT2 = 0x000000000022D473030F116dDEE9F6B43aC78BA3;

    // The tail Permit2 appends to "PermitWitnessTransferFrom(TokenPermissions permitted,address
    // spender,uint256 nonce,uint256 deadline," to build the signed type: the witness member, then
    // the referenced structs in alphabetical order, as EIP-712 encodes them.
    string public constant DEPOSIT_WITNESS_TYPE_STRING =
        "DepositWitness witness)DepositWitness(bytes32 channelId)TokenPermissions(address token,uint256 amount)";
    bytes32 public constant DEPOSIT_WITNESS_TYPEHASH = keccak256("DepositWitness(bytes32 channelId)");

    error Permit2612AmountMismatch();

    function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes calldata collectorData)
        external
        onlySettlement
    {
        (uint256 nonce, uint256 deadline, bytes memory signature, bytes memory eip2612) =
            abi.decode(collectorData, (uint256, uint256, bytes, bytes));
        if (eip2612.length != 0) _tryPermit(payer, token, amount, eip2612);

        IPermit2WitnessTransfer(PERMIT2).permitWitnessTransferFrom(
            IPermit2WitnessTransfer.PermitTransferFrom({
                permitted: IPermit2WitnessTransfer.TokenPermissions({token: token, amount: amount}),
                nonce: nonce,
                deadline: deadline
            }),
            IPermit2WitnessTransfer.SignatureTransferDetails({to: x402BatchSettlement, requestedAmount: amount}),
            payer,
            keccak256(abi.encode(DEPOSIT_WITNESS_TYPEHASH, channelId)),
            DEPOSIT_WITNESS_TYPE_STRING,
            signature
        );
    }

    // A failed permit is ignored: someone may have submitted the same permit first (the allowance is
    // then set), and if the allowance is missing the Permit2 transfer fails anyway.
    function _tryPermit(address payer, address token, uint256 amount, bytes memory data) private {
        (uint256 value, uint256 deadline, uint8 v, bytes32 r, bytes32 s) =
            abi.decode(data, (uint256, uint256, uint8, bytes32, bytes32));
        if (value != amount) revert Permit2612AmountMismatch();
        try IERC20Permit(token).permit(payer, PERMIT2, value, deadline, v, r, s) {} catch {}
    }
}
