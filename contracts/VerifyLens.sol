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
/// Rebuild `src/facilitator/evm/lens.hex` from this file with `scripts/build-lens`.
contract VerifyLens {
    struct Facts {
        uint256 blockNumber;
        uint256 timestamp;
        uint256 fromCodeSize;
        /// `from`'s code size once `factory` ran (ERC-6492: a wallet not yet deployed); the
        /// same as `fromCodeSize` when no factory was given or `from` already had code.
        uint256 walletCodeSize;
        bool balanceRead;
        uint256 balance;
        /// The word that says whether the authorization's nonce is used (`stateCall`'s answer).
        bool authorizationStateRead;
        uint256 authorizationState;
        /// `allowance(from, allowanceSpender)` on the token, when a spender was given.
        bool allowanceRead;
        uint256 allowance;
        bool fromBlacklisted;
        bool toBlacklisted;
        /// What `from` answered to `erc1271Call` (after the deployment, if any); empty when not
        /// asked, when `from` has no code, or when the call reverted.
        bytes erc1271Answer;
        /// Whether `trialCall` was tried (asked, and its outcome came back).
        bool trialRan;
        /// The call succeeded and the authorization is used afterwards: a call that succeeds
        /// without settling (to an address with no code, say) did not succeed.
        bool trialSucceeded;
        /// Gas the call to `trialTarget` took, from before the CALL to after it: the call's own
        /// cost with the target's account cold, and everything it ran.
        uint256 trialGas;
        /// What the target reverted with, when it did.
        bytes trialRevert;
        /// The token took `permitCall` (tried after the deployment, and undone).
        bool permitAccepted;
    }

    /// The outcome of `tryCall`, carried out by its revert.
    error Tried(bool succeeded, uint256 gas, bytes revertData);
    /// The outcome of `tryPermit`, carried out by its revert.
    error Permitted(bool accepted);

    /// The payment and the settlement to try. `stateCall` on `stateTarget` reads the word in
    /// which `stateMask`'s bits say the authorization's nonce is used (the token's
    /// `authorizationState`, or Permit2's `nonceBitmap`). `factory` and `factoryCall` deploy
    /// `from` first when it has no code (ERC-6492); a zero `factory` deploys nothing.
    /// `permitCall`, when not empty, is an EIP-2612 permit of Permit2 that the settlement submits
    /// to the token first (`settleWithPermit`).
    struct Ask {
        address token;
        address from;
        address payTo;
        address stateTarget;
        bytes stateCall;
        uint256 stateMask;
        address allowanceSpender;
        address factory;
        bytes factoryCall;
        bytes erc1271Call;
        address trialTarget;
        bytes trialCall;
        bytes permitCall;
    }

    function facts(Ask calldata ask) external returns (Facts memory f) {
        (f,) = read(ask, gasleft());
    }

    /// The facts of several payments in one call: for each, in order, what `facts` answers, or
    /// nothing (empty bytes) when it could not be read in its share of the gas: that payment is
    /// then read on its own. Each ask gets an even share of the gas left, so a payer's wallet
    /// that burns its gas cannot starve the asks after it. An ask that changes state (an
    /// ERC-6492 deployment, a permit) runs in a frame of its own that reverts: what it changed
    /// is undone before the next, so every ask sees the chain as a call of its own would. No
    /// settlement is tried here (an ask with a trial is answered nothing): a trial's gas is
    /// measured with the token's account cold, and the asks before it have warmed it.
    function factsEach(Ask[] calldata asks) external returns (bytes[] memory answers) {
        answers = new bytes[](asks.length);
        for (uint256 i = 0; i < asks.length; i++) {
            uint256 share = gasleft() / (asks.length - i + 1);
            Ask calldata ask = asks[i];
            if (ask.trialCall.length != 0) continue;
            if (ask.factory == address(0) && ask.permitCall.length == 0) {
                // Reads only: nothing to undo, and no gas is measured, so a warm account
                // changes no answer.
                (Facts memory f, bool starved) = read(ask, share);
                if (!starved) answers[i] = abi.encode(f);
            } else {
                (, answers[i]) = address(this).call{gas: share}(abi.encodeCall(this.factsUndone, (ask)));
            }
        }
    }

    /// Only for `factsEach`, through a call to this contract's own address: reverts with the
    /// ABI encoding of the ask's `Facts`, exactly what `facts` returns, or with nothing.
    function factsUndone(Ask calldata ask) external {
        (Facts memory f, bool starved) = read(ask, gasleft());
        bytes memory encoded = starved ? bytes("") : abi.encode(f);
        assembly {
            revert(add(encoded, 32), mload(encoded))
        }
    }

    /// `walletGas` bounds the payer's wallet's ERC-1271 answer; `starved`: the wallet used all
    /// the gas it was given, so its answer is unknown (not "no").
    function read(Ask calldata ask, uint256 walletGas) private returns (Facts memory f, bool starved) {
        address from = ask.from;
        // First, on state nothing has read yet: the gas is then the gas of a transaction whose
        // storage slots are all cold, as a settlement's are. A settlement that deploys the
        // wallet does so itself (through `trialTarget`), so the trial runs before the deployment.
        if (ask.trialCall.length != 0) {
            (f.trialRan, f.trialSucceeded, f.trialGas, f.trialRevert) = trial(ask);
        }
        f.blockNumber = block.number;
        f.timestamp = block.timestamp;
        f.fromCodeSize = from.code.length;
        if (ask.factory != address(0) && f.fromCodeSize == 0) {
            // Inside this eth_call only: nothing is deployed on chain. Whether it worked is
            // read next, as the wallet's code size.
            (bool ran,) = ask.factory.call(ask.factoryCall);
            ran;
        }
        f.walletCodeSize = from.code.length;
        address token = ask.token;
        (f.balanceRead, f.balance) = word(token, abi.encodeWithSignature("balanceOf(address)", from));
        (f.authorizationStateRead, f.authorizationState) = word(ask.stateTarget, ask.stateCall);
        if (ask.allowanceSpender != address(0)) {
            (f.allowanceRead, f.allowance) =
                word(token, abi.encodeWithSignature("allowance(address,address)", from, ask.allowanceSpender));
        }
        f.fromBlacklisted = flag(token, from);
        f.toBlacklisted = flag(token, ask.payTo);
        if (ask.erc1271Call.length != 0 && f.walletCodeSize != 0) {
            uint256 before = gasleft();
            uint256 given = before - before / 64 < walletGas ? before - before / 64 : walletGas;
            (bool ok, bytes memory answer) = from.staticcall{gas: walletGas}(ask.erc1271Call);
            if (ok) f.erc1271Answer = answer;
            else starved = before - gasleft() >= given;
        }
        if (ask.permitCall.length != 0) f.permitAccepted = permits(token, ask.permitCall);
    }

    /// Whether the token takes the permit, tried in a frame that reverts: the permit nonce it
    /// spends and the allowance it sets are undone.
    function permits(address token, bytes calldata permitCall) private returns (bool) {
        (, bytes memory outcome) = address(this).call(abi.encodeCall(this.tryPermit, (token, permitCall)));
        return outcome.length == 36 && bytes4(outcome) == Permitted.selector && uint8(outcome[35]) == 1;
    }

    /// Only for `permits`, through a call to this contract's own address.
    function tryPermit(address token, bytes calldata permitCall) external {
        (bool accepted,) = token.call(permitCall);
        revert Permitted(accepted);
    }

    /// Runs the trial call in a frame that always reverts. A reverted frame undoes its state
    /// changes and the accounts and slots it warmed (EIP-2929), so the reads after it see the
    /// chain exactly as it is.
    function trial(Ask calldata ask)
        private
        returns (bool ran, bool succeeded, uint256 gas, bytes memory revertData)
    {
        (, bytes memory outcome) = address(this).call(abi.encodeCall(this.tryCall, (ask)));
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
    function tryCall(Ask calldata ask) external {
        address target = ask.trialTarget;
        bytes calldata call = ask.trialCall;
        uint256 before = gasleft();
        (bool succeeded, bytes memory answer) = target.call(call);
        uint256 gas = before - gasleft();
        if (succeeded) {
            (bool read, uint256 state) = word(ask.stateTarget, ask.stateCall);
            if (!read || state & ask.stateMask == 0) {
                succeeded = false;
                answer = abi.encodeWithSignature("Error(string)", "the settlement call did not use the authorization");
            }
        }
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
