// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.26;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Permit.sol";

/// For the end-to-end tests only: a plain ERC-20 with EIP-2612 permits (EIP-712 name "Test Token",
/// version "1") and no ERC-3009, so that x402 clients can pay with it only through Permit2.
/// 18 decimals, OpenZeppelin's default, unlike USDC's 6.
contract TestToken is ERC20, ERC20Permit {
    constructor() ERC20("Test Token", "TT") ERC20Permit("Test Token") {}

    /// Open to anyone: a test chain's token, funded by whoever sets a test up.
    function mint(address to, uint256 amount) external {
        _mint(to, amount);
    }
}
