// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.26;

/// Every chain fact one x402 verify needs, read in one `eth_call`.
///
/// Never deployed. routerd places this contract's runtime code at an unused address through
/// `eth_call`'s state override and calls `facts`. Every token read is a `staticcall` whose
/// failure is reported, not reverted, so routerd applies the same rules as when it sends the
/// reads one by one: a token without `isBlacklisted` blacklists nobody, and a balance or an
/// authorization state that cannot be read makes the chain unreadable for this request.
///
/// Rebuild `src/facilitator/lens.hex` from this file with `scripts/build-lens`.
contract VerifyLens {
    struct Facts {
        uint256 blockNumber;
        uint256 timestamp;
        uint256 fromCodeSize;
        bool balanceRead;
        uint256 balance;
        bool authorizationStateRead;
        uint256 authorizationState;
        bool fromBlacklisted;
        bool toBlacklisted;
        /// What `from` answered to `erc1271Call`; empty when not asked, when `from` has no
        /// code, or when the call reverted.
        bytes erc1271Answer;
    }

    function facts(
        address token,
        address from,
        address payTo,
        bytes32 nonce,
        bytes calldata erc1271Call
    ) external view returns (Facts memory f) {
        f.blockNumber = block.number;
        f.timestamp = block.timestamp;
        f.fromCodeSize = from.code.length;
        (f.balanceRead, f.balance) = word(token, abi.encodeWithSignature("balanceOf(address)", from));
        (f.authorizationStateRead, f.authorizationState) =
            word(token, abi.encodeWithSignature("authorizationState(address,bytes32)", from, nonce));
        f.fromBlacklisted = flag(token, from);
        f.toBlacklisted = flag(token, payTo);
        if (erc1271Call.length != 0 && f.fromCodeSize != 0) {
            (bool ok, bytes memory answer) = from.staticcall(erc1271Call);
            if (ok) f.erc1271Answer = answer;
        }
    }

    function flag(address token, address account) private view returns (bool) {
        (bool read, uint256 value) = word(token, abi.encodeWithSignature("isBlacklisted(address)", account));
        return read && value != 0;
    }

    function word(address target, bytes memory data) private view returns (bool, uint256) {
        (bool ok, bytes memory answer) = target.staticcall(data);
        if (!ok || answer.length < 32) return (false, 0);
        return (true, abi.decode(answer, (uint256)));
    }
}
