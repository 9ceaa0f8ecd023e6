//! The start-up check of the `batch-settlement` contracts: with the scheme on, every served EVM
//! network must have code at each of `[chains.<name>.contracts]`. A missing contract would make
//! every deposit, claim and sweep there fail; a start that names the key tells the operator
//! which address to fix before a payer meets it.

use std::sync::Arc;

use serde_json::json;

use crate::chain::{Call, Chain, Traffic};
use crate::config::BatchContract;
use crate::evm::hex_bytes;

/// Why a served network cannot serve `batch-settlement`, named by the contract's key.
#[derive(Debug, thiserror::Error)]
pub enum ContractsError {
    #[error("chains.{chain}.contracts.{}: no contract code at {address}", contract.key())]
    NoCode {
        chain: String,
        contract: BatchContract,
        address: String,
    },
    #[error("chains.{chain}.contracts.{}: eth_getCode: {reason}", contract.key())]
    Unreadable {
        chain: String,
        contract: BatchContract,
        reason: String,
    },
}

/// Asks each chain, in one batch, for the code at its three contract addresses.
pub async fn check_batch_contracts(
    chains: impl IntoIterator<Item = &Arc<Chain>>,
) -> Result<(), ContractsError> {
    for chain in chains {
        check_chain(chain).await?;
    }
    Ok(())
}

async fn check_chain(chain: &Chain) -> Result<(), ContractsError> {
    let contracts = &chain.settings.contracts;
    let calls: Vec<Call> = BatchContract::ALL
        .iter()
        .map(|&c| {
            let address = hex_bytes(contracts.get(c));
            Call::new("eth_getCode", vec![json!(address), json!("latest")])
        })
        .collect();
    let unreadable = |contract, reason: String| ContractsError::Unreadable {
        chain: chain.name.clone(),
        contract,
        reason,
    };
    let answers = chain
        .client
        .batch(Traffic::Own, &calls)
        .await
        .map_err(|e| unreadable(BatchContract::BatchSettlement, e.to_string()))?;
    for (contract, answer) in BatchContract::ALL.into_iter().zip(answers) {
        let code = answer.map_err(|e| unreadable(contract, e.to_string()))?;
        if code.as_str().is_none_or(|c| c.len() <= 2) {
            return Err(ContractsError::NoCode {
                chain: chain.name.clone(),
                contract,
                address: ethers_core::utils::to_checksum(&contracts.get(contract), None),
            });
        }
    }
    Ok(())
}
