// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.26;

import {ERC4337} from "solady/accounts/ERC4337.sol";
import {ERC4337Factory} from "solady/accounts/ERC4337Factory.sol";

/// For the end-to-end tests only: Solady's ERC-4337 account, the smart wallet viem's
/// `toSoladySmartAccount` signs for (ERC-1271 through ERC-7739's nested typed data, wrapped in
/// ERC-6492 while the wallet is not deployed), with the one thing Solady leaves to its user:
/// the wallet's own EIP-712 name and version. Its factory is Solady's as published.
contract SmartWallet is ERC4337 {
    function _domainNameAndVersion() internal pure override returns (string memory, string memory) {
        return ("SmartWallet", "1");
    }
}
