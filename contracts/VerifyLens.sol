// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.26;

/// Every chain fact one x402 verify needs, read in one `eth_call`; for a settlement, also the
/// settlement transaction tried and its gas measured, in the same call.
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
        /// Whether `trialCall` was tried (asked, and its outcome came back).
        bool trialRan;
        bool trialSucceeded;
        /// Gas the call to the token took, from before the CALL to after it: the call's own
        /// cost with the token's account cold, and everything the token ran.
        uint256 trialGas;
        /// What the token reverted with, when it did.
        bytes trialRevert;
    }

    /// The outcome of `tryCall`, carried out by its revert.
    error Tried(bool succeeded, uint256 gas, bytes revertData);

    function facts(
        address token,
        address from,
        address payTo,
        bytes32 nonce,
        bytes calldata erc1271Call,
        bytes calldata trialCall
    ) external returns (Facts memory f) {
        // First, on state nothing has read yet: the gas is then the gas of a transaction whose
        // storage slots are all cold, as a settlement's are.
        if (trialCall.length != 0) {
            (f.trialRan, f.trialSucceeded, f.trialGas, f.trialRevert) = trial(token, trialCall);
        }
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

    /// Runs `call` on `token` in a frame that always reverts. A reverted frame undoes its state
    /// changes and the accounts and slots it warmed (EIP-2929), so the reads after it see the
    /// chain exactly as it is.
    function trial(address token, bytes calldata call)
        private
        returns (bool ran, bool succeeded, uint256 gas, bytes memory revertData)
    {
        (, bytes memory outcome) = address(this).call(abi.encodeCall(this.tryCall, (token, call)));
        if (outcome.length < 4 || bytes4(outcome) != Tried.selector) return (false, false, 0, "");
        assembly {
            // Skip the selector: the rest is the ABI encoding of Tried's fields.
            let length := mload(outcome)
            outcome := add(outcome, 4)
            mstore(outcome, sub(length, 4))
        }
        (succeeded, gas, revertData) = abi.decode(outcome, (bool, uint256, bytes));
        ran = true;
    }

    /// Only for `trial`, through a call to this contract's own address.
    function tryCall(address token, bytes calldata call) external {
        uint256 before = gasleft();
        (bool succeeded, bytes memory answer) = token.call(call);
        uint256 gas = before - gasleft();
        revert Tried(succeeded, gas, succeeded ? bytes("") : answer);
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
