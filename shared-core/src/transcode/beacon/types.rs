//! The Beacon-API objects' SSZ types, as the consensus specs define them (mainnet preset), for
//! every fork from phase0 to fulu. Every container is named as in the specs so that the tests can find
//! its ssz_static vectors.

use super::ssz_type::{Field, Ty};

const fn field(name: &'static str, ty: Ty) -> Field {
    Field::new(name, ty)
}

const U8: Ty = Ty::Uint(1);
const U64: Ty = Ty::Uint(8);
const U256: Ty = Ty::Uint(32);
const VERSION: Ty = Ty::Bytes(4);
const ADDRESS: Ty = Ty::Bytes(20);
const ROOT: Ty = Ty::Bytes(32);
const PUBKEY: Ty = Ty::Bytes(48);
const KZG_COMMITMENT: Ty = Ty::Bytes(48);
const KZG_PROOF: Ty = Ty::Bytes(48);
const SIGNATURE: Ty = Ty::Bytes(96);
const LOGS_BLOOM: Ty = Ty::Bytes(256);
/// `Blob`: `FIELD_ELEMENTS_PER_BLOB * BYTES_PER_FIELD_ELEMENT`.
pub(super) const BLOB: Ty = Ty::Bytes(4096 * 32);

const MAX_VALIDATORS_PER_COMMITTEE: u64 = 2048;
const MAX_COMMITTEES_PER_SLOT: usize = 64;
const VALIDATOR_REGISTRY_LIMIT: u64 = 1 << 40;
pub(super) const MAX_BLOB_COMMITMENTS_PER_BLOCK: u64 = 4096;
const SLOTS_PER_HISTORICAL_ROOT: usize = 8192;
const HISTORICAL_ROOTS_LIMIT: u64 = 1 << 24;
const SYNC_COMMITTEE_SIZE: usize = 512;

pub(super) const FORK: Ty =
    Ty::Container(&[field("previous_version", VERSION), field("current_version", VERSION), field("epoch", U64)]);
pub(super) const CHECKPOINT: Ty = Ty::Container(&[field("epoch", U64), field("root", ROOT)]);
pub(super) const ETH1_DATA: Ty =
    Ty::Container(&[field("deposit_root", ROOT), field("deposit_count", U64), field("block_hash", ROOT)]);
pub(super) const BEACON_BLOCK_HEADER: Ty = Ty::Container(&[
    field("slot", U64),
    field("proposer_index", U64),
    field("parent_root", ROOT),
    field("state_root", ROOT),
    field("body_root", ROOT),
]);
pub(super) const SIGNED_BEACON_BLOCK_HEADER: Ty =
    Ty::Container(&[field("message", BEACON_BLOCK_HEADER), field("signature", SIGNATURE)]);
pub(super) const PROPOSER_SLASHING: Ty = Ty::Container(&[
    field("signed_header_1", SIGNED_BEACON_BLOCK_HEADER),
    field("signed_header_2", SIGNED_BEACON_BLOCK_HEADER),
]);
pub(super) const ATTESTATION_DATA: Ty = Ty::Container(&[
    field("slot", U64),
    field("index", U64),
    field("beacon_block_root", ROOT),
    field("source", CHECKPOINT),
    field("target", CHECKPOINT),
]);
pub(super) const DEPOSIT_DATA: Ty = Ty::Container(&[
    field("pubkey", PUBKEY),
    field("withdrawal_credentials", ROOT),
    field("amount", U64),
    field("signature", SIGNATURE),
]);
/// The proof's length is `DEPOSIT_CONTRACT_TREE_DEPTH + 1`.
pub(super) const DEPOSIT: Ty = Ty::Container(&[field("proof", Ty::Vector(&ROOT, 33)), field("data", DEPOSIT_DATA)]);
pub(super) const VOLUNTARY_EXIT: Ty = Ty::Container(&[field("epoch", U64), field("validator_index", U64)]);
pub(super) const SIGNED_VOLUNTARY_EXIT: Ty =
    Ty::Container(&[field("message", VOLUNTARY_EXIT), field("signature", SIGNATURE)]);
pub(super) const SYNC_AGGREGATE: Ty = Ty::Container(&[
    field("sync_committee_bits", Ty::Bitvector(SYNC_COMMITTEE_SIZE)),
    field("sync_committee_signature", SIGNATURE),
]);
pub(super) const WITHDRAWAL: Ty = Ty::Container(&[
    field("index", U64),
    field("validator_index", U64),
    field("address", ADDRESS),
    field("amount", U64),
]);
/// Deneb's, unchanged since; the proof's length is `KZG_COMMITMENT_INCLUSION_PROOF_DEPTH`.
pub(super) const BLOB_SIDECAR: Ty = Ty::Container(&[
    field("index", U64),
    field("blob", BLOB),
    field("kzg_commitment", KZG_COMMITMENT),
    field("kzg_proof", KZG_PROOF),
    field("signed_block_header", SIGNED_BEACON_BLOCK_HEADER),
    field("kzg_commitment_inclusion_proof", Ty::Vector(&ROOT, 17)),
]);
/// Fulu's: a cell is `FIELD_ELEMENTS_PER_CELL * BYTES_PER_FIELD_ELEMENT` bytes, the proof's
/// length `KZG_COMMITMENTS_INCLUSION_PROOF_DEPTH`.
pub(super) const DATA_COLUMN_SIDECAR: Ty = Ty::Container(&[
    field("index", U64),
    field("column", Ty::List(&Ty::Bytes(64 * 32), MAX_BLOB_COMMITMENTS_PER_BLOCK)),
    field("kzg_commitments", Ty::List(&KZG_COMMITMENT, MAX_BLOB_COMMITMENTS_PER_BLOCK)),
    field("kzg_proofs", Ty::List(&KZG_PROOF, MAX_BLOB_COMMITMENTS_PER_BLOCK)),
    field("signed_block_header", SIGNED_BEACON_BLOCK_HEADER),
    field("kzg_commitments_inclusion_proof", Ty::Vector(&ROOT, 4)),
]);
pub(super) const BLS_TO_EXECUTION_CHANGE: Ty = Ty::Container(&[
    field("validator_index", U64),
    field("from_bls_pubkey", PUBKEY),
    field("to_execution_address", ADDRESS),
]);
pub(super) const SIGNED_BLS_TO_EXECUTION_CHANGE: Ty =
    Ty::Container(&[field("message", BLS_TO_EXECUTION_CHANGE), field("signature", SIGNATURE)]);

/// An execution payload's fields: bellatrix's, then `$later` (its lists or, in the header, their
/// roots, and what later forks append).
macro_rules! execution_payload {
    ($($later:expr),*) => {
        Ty::Container(&[
            field("parent_hash", ROOT),
            field("fee_recipient", ADDRESS),
            field("state_root", ROOT),
            field("receipts_root", ROOT),
            field("logs_bloom", LOGS_BLOOM),
            field("prev_randao", ROOT),
            field("block_number", U64),
            field("gas_limit", U64),
            field("gas_used", U64),
            field("timestamp", U64),
            field("extra_data", Ty::ByteList(32)),
            field("base_fee_per_gas", U256),
            field("block_hash", ROOT),
            $($later),*
        ])
    };
}

// MAX_TRANSACTIONS_PER_PAYLOAD of MAX_BYTES_PER_TRANSACTION
const TRANSACTIONS: Field = field("transactions", Ty::List(&Ty::ByteList(1 << 30), 1 << 20));
const WITHDRAWALS: Field = field("withdrawals", Ty::List(&WITHDRAWAL, 16));
const TRANSACTIONS_ROOT: Field = field("transactions_root", ROOT);
const WITHDRAWALS_ROOT: Field = field("withdrawals_root", ROOT);
const BLOB_GAS_USED: Field = field("blob_gas_used", U64);
const EXCESS_BLOB_GAS: Field = field("excess_blob_gas", U64);

pub(super) const BELLATRIX_EXECUTION_PAYLOAD: Ty = execution_payload!(TRANSACTIONS);
pub(super) const BELLATRIX_EXECUTION_PAYLOAD_HEADER: Ty = execution_payload!(TRANSACTIONS_ROOT);
pub(super) const CAPELLA_EXECUTION_PAYLOAD: Ty = execution_payload!(TRANSACTIONS, WITHDRAWALS);
pub(super) const CAPELLA_EXECUTION_PAYLOAD_HEADER: Ty = execution_payload!(TRANSACTIONS_ROOT, WITHDRAWALS_ROOT);
/// Deneb's, unchanged in electra and fulu.
pub(super) const EXECUTION_PAYLOAD: Ty = execution_payload!(TRANSACTIONS, WITHDRAWALS, BLOB_GAS_USED, EXCESS_BLOB_GAS);
pub(super) const EXECUTION_PAYLOAD_HEADER: Ty =
    execution_payload!(TRANSACTIONS_ROOT, WITHDRAWALS_ROOT, BLOB_GAS_USED, EXCESS_BLOB_GAS);

/// An `IndexedAttestation` of up to `max` validators.
macro_rules! indexed_attestation {
    ($max:expr) => {
        Ty::Container(&[
            field("attesting_indices", Ty::List(&U64, $max)),
            field("data", ATTESTATION_DATA),
            field("signature", SIGNATURE),
        ])
    };
}

/// A block body's fields: phase0's, with the fork's attester slashings and attestations, then
/// what later forks append.
macro_rules! block_body {
    ($attester_slashings:expr, $attestations:expr $(, $later:expr)*) => {
        Ty::Container(&[
            field("randao_reveal", SIGNATURE),
            field("eth1_data", ETH1_DATA),
            field("graffiti", ROOT),
            field("proposer_slashings", Ty::List(&PROPOSER_SLASHING, 16)),
            field("attester_slashings", $attester_slashings),
            field("attestations", $attestations),
            field("deposits", Ty::List(&DEPOSIT, 16)),
            field("voluntary_exits", Ty::List(&SIGNED_VOLUNTARY_EXIT, 16)),
            $($later),*
        ])
    };
}

const SYNC_AGGREGATE_FIELD: Field = field("sync_aggregate", SYNC_AGGREGATE);
const BLS_TO_EXECUTION_CHANGES: Field =
    field("bls_to_execution_changes", Ty::List(&SIGNED_BLS_TO_EXECUTION_CHANGE, 16));
const BLOB_KZG_COMMITMENTS: Field =
    field("blob_kzg_commitments", Ty::List(&KZG_COMMITMENT, MAX_BLOB_COMMITMENTS_PER_BLOCK));

// deneb

pub(super) const INDEXED_ATTESTATION: Ty = indexed_attestation!(MAX_VALIDATORS_PER_COMMITTEE);
pub(super) const ATTESTER_SLASHING: Ty =
    Ty::Container(&[field("attestation_1", INDEXED_ATTESTATION), field("attestation_2", INDEXED_ATTESTATION)]);
pub(super) const ATTESTATION: Ty = Ty::Container(&[
    field("aggregation_bits", Ty::Bitlist(MAX_VALIDATORS_PER_COMMITTEE)),
    field("data", ATTESTATION_DATA),
    field("signature", SIGNATURE),
]);

/// The body of phase0 to deneb, with `$later` after its voluntary exits.
macro_rules! phase0_body {
    ($($later:expr),*) => {
        block_body!(Ty::List(&ATTESTER_SLASHING, 2), Ty::List(&ATTESTATION, 128) $(, $later)*)
    };
}

pub(super) const PHASE0_BEACON_BLOCK_BODY: Ty = phase0_body!();
pub(super) const ALTAIR_BEACON_BLOCK_BODY: Ty = phase0_body!(SYNC_AGGREGATE_FIELD);
pub(super) const BELLATRIX_BEACON_BLOCK_BODY: Ty =
    phase0_body!(SYNC_AGGREGATE_FIELD, field("execution_payload", BELLATRIX_EXECUTION_PAYLOAD));
pub(super) const BELLATRIX_BLINDED_BEACON_BLOCK_BODY: Ty =
    phase0_body!(SYNC_AGGREGATE_FIELD, field("execution_payload_header", BELLATRIX_EXECUTION_PAYLOAD_HEADER));
pub(super) const CAPELLA_BEACON_BLOCK_BODY: Ty =
    phase0_body!(SYNC_AGGREGATE_FIELD, field("execution_payload", CAPELLA_EXECUTION_PAYLOAD), BLS_TO_EXECUTION_CHANGES);
pub(super) const CAPELLA_BLINDED_BEACON_BLOCK_BODY: Ty = phase0_body!(
    SYNC_AGGREGATE_FIELD,
    field("execution_payload_header", CAPELLA_EXECUTION_PAYLOAD_HEADER),
    BLS_TO_EXECUTION_CHANGES
);
pub(super) const DENEB_BEACON_BLOCK_BODY: Ty = phase0_body!(
    SYNC_AGGREGATE_FIELD,
    field("execution_payload", EXECUTION_PAYLOAD),
    BLS_TO_EXECUTION_CHANGES,
    BLOB_KZG_COMMITMENTS
);
pub(super) const DENEB_BLINDED_BEACON_BLOCK_BODY: Ty = phase0_body!(
    SYNC_AGGREGATE_FIELD,
    field("execution_payload_header", EXECUTION_PAYLOAD_HEADER),
    BLS_TO_EXECUTION_CHANGES,
    BLOB_KZG_COMMITMENTS
);

// electra (and fulu)

pub(super) const ELECTRA_INDEXED_ATTESTATION: Ty =
    indexed_attestation!(MAX_VALIDATORS_PER_COMMITTEE * MAX_COMMITTEES_PER_SLOT as u64);
pub(super) const ELECTRA_ATTESTER_SLASHING: Ty = Ty::Container(&[
    field("attestation_1", ELECTRA_INDEXED_ATTESTATION),
    field("attestation_2", ELECTRA_INDEXED_ATTESTATION),
]);
pub(super) const ELECTRA_ATTESTATION: Ty = Ty::Container(&[
    field("aggregation_bits", Ty::Bitlist(MAX_VALIDATORS_PER_COMMITTEE * MAX_COMMITTEES_PER_SLOT as u64)),
    field("data", ATTESTATION_DATA),
    field("signature", SIGNATURE),
    field("committee_bits", Ty::Bitvector(MAX_COMMITTEES_PER_SLOT)),
]);
pub(super) const DEPOSIT_REQUEST: Ty = Ty::Container(&[
    field("pubkey", PUBKEY),
    field("withdrawal_credentials", ROOT),
    field("amount", U64),
    field("signature", SIGNATURE),
    field("index", U64),
]);
pub(super) const WITHDRAWAL_REQUEST: Ty =
    Ty::Container(&[field("source_address", ADDRESS), field("validator_pubkey", PUBKEY), field("amount", U64)]);
pub(super) const CONSOLIDATION_REQUEST: Ty =
    Ty::Container(&[field("source_address", ADDRESS), field("source_pubkey", PUBKEY), field("target_pubkey", PUBKEY)]);
pub(super) const EXECUTION_REQUESTS: Ty = Ty::Container(&[
    field("deposits", Ty::List(&DEPOSIT_REQUEST, 8192)),
    field("withdrawals", Ty::List(&WITHDRAWAL_REQUEST, 16)),
    field("consolidations", Ty::List(&CONSOLIDATION_REQUEST, 2)),
]);

macro_rules! electra_body {
    ($payload:expr) => {
        block_body!(
            Ty::List(&ELECTRA_ATTESTER_SLASHING, 1),
            Ty::List(&ELECTRA_ATTESTATION, 8),
            SYNC_AGGREGATE_FIELD,
            $payload,
            BLS_TO_EXECUTION_CHANGES,
            BLOB_KZG_COMMITMENTS,
            field("execution_requests", EXECUTION_REQUESTS)
        )
    };
}

pub(super) const ELECTRA_BEACON_BLOCK_BODY: Ty = electra_body!(field("execution_payload", EXECUTION_PAYLOAD));
pub(super) const ELECTRA_BLINDED_BEACON_BLOCK_BODY: Ty =
    electra_body!(field("execution_payload_header", EXECUTION_PAYLOAD_HEADER));

/// A block around `body`, and the signed block around that.
macro_rules! signed_block {
    ($body:expr) => {
        Ty::Container(&[
            field(
                "message",
                Ty::Container(&[
                    field("slot", U64),
                    field("proposer_index", U64),
                    field("parent_root", ROOT),
                    field("state_root", ROOT),
                    field("body", $body),
                ]),
            ),
            field("signature", SIGNATURE),
        ])
    };
}

pub(super) const PHASE0_SIGNED_BEACON_BLOCK: Ty = signed_block!(PHASE0_BEACON_BLOCK_BODY);
pub(super) const ALTAIR_SIGNED_BEACON_BLOCK: Ty = signed_block!(ALTAIR_BEACON_BLOCK_BODY);
pub(super) const BELLATRIX_SIGNED_BEACON_BLOCK: Ty = signed_block!(BELLATRIX_BEACON_BLOCK_BODY);
pub(super) const BELLATRIX_SIGNED_BLINDED_BEACON_BLOCK: Ty = signed_block!(BELLATRIX_BLINDED_BEACON_BLOCK_BODY);
pub(super) const CAPELLA_SIGNED_BEACON_BLOCK: Ty = signed_block!(CAPELLA_BEACON_BLOCK_BODY);
pub(super) const CAPELLA_SIGNED_BLINDED_BEACON_BLOCK: Ty = signed_block!(CAPELLA_BLINDED_BEACON_BLOCK_BODY);
pub(super) const DENEB_SIGNED_BEACON_BLOCK: Ty = signed_block!(DENEB_BEACON_BLOCK_BODY);
pub(super) const DENEB_SIGNED_BLINDED_BEACON_BLOCK: Ty = signed_block!(DENEB_BLINDED_BEACON_BLOCK_BODY);
pub(super) const ELECTRA_SIGNED_BEACON_BLOCK: Ty = signed_block!(ELECTRA_BEACON_BLOCK_BODY);
pub(super) const ELECTRA_SIGNED_BLINDED_BEACON_BLOCK: Ty = signed_block!(ELECTRA_BLINDED_BEACON_BLOCK_BODY);

// the state

pub(super) const VALIDATOR: Ty = Ty::Container(&[
    field("pubkey", PUBKEY),
    field("withdrawal_credentials", ROOT),
    field("effective_balance", U64),
    field("slashed", Ty::Bool),
    field("activation_eligibility_epoch", U64),
    field("activation_epoch", U64),
    field("exit_epoch", U64),
    field("withdrawable_epoch", U64),
]);
pub(super) const SYNC_COMMITTEE: Ty =
    Ty::Container(&[field("pubkeys", Ty::Vector(&PUBKEY, SYNC_COMMITTEE_SIZE)), field("aggregate_pubkey", PUBKEY)]);
pub(super) const HISTORICAL_SUMMARY: Ty =
    Ty::Container(&[field("block_summary_root", ROOT), field("state_summary_root", ROOT)]);
pub(super) const PENDING_DEPOSIT: Ty = Ty::Container(&[
    field("pubkey", PUBKEY),
    field("withdrawal_credentials", ROOT),
    field("amount", U64),
    field("signature", SIGNATURE),
    field("slot", U64),
]);
pub(super) const PENDING_PARTIAL_WITHDRAWAL: Ty =
    Ty::Container(&[field("validator_index", U64), field("amount", U64), field("withdrawable_epoch", U64)]);
pub(super) const PENDING_CONSOLIDATION: Ty = Ty::Container(&[field("source_index", U64), field("target_index", U64)]);

/// Phase0's pending attestation, which its state keeps per epoch.
pub(super) const PENDING_ATTESTATION: Ty = Ty::Container(&[
    field("aggregation_bits", Ty::Bitlist(MAX_VALIDATORS_PER_COMMITTEE)),
    field("data", ATTESTATION_DATA),
    field("inclusion_delay", U64),
    field("proposer_index", U64),
]);

// JUSTIFICATION_BITS_LENGTH
const JUSTIFICATION_BITS: Field = field("justification_bits", Ty::Bitvector(4));
const PREVIOUS_JUSTIFIED: Field = field("previous_justified_checkpoint", CHECKPOINT);
const CURRENT_JUSTIFIED: Field = field("current_justified_checkpoint", CHECKPOINT);
const FINALIZED: Field = field("finalized_checkpoint", CHECKPOINT);

/// The state's fields: phase0's through its slashings, then the fork's (`$later`).
macro_rules! beacon_state {
    ($($later:expr),*) => {
        Ty::Container(&[
            field("genesis_time", U64),
            field("genesis_validators_root", ROOT),
            field("slot", U64),
            field("fork", FORK),
            field("latest_block_header", BEACON_BLOCK_HEADER),
            field("block_roots", Ty::Vector(&ROOT, SLOTS_PER_HISTORICAL_ROOT)),
            field("state_roots", Ty::Vector(&ROOT, SLOTS_PER_HISTORICAL_ROOT)),
            field("historical_roots", Ty::List(&ROOT, HISTORICAL_ROOTS_LIMIT)),
            field("eth1_data", ETH1_DATA),
            // EPOCHS_PER_ETH1_VOTING_PERIOD * SLOTS_PER_EPOCH
            field("eth1_data_votes", Ty::List(&ETH1_DATA, 64 * 32)),
            field("eth1_deposit_index", U64),
            field("validators", Ty::List(&VALIDATOR, VALIDATOR_REGISTRY_LIMIT)),
            field("balances", Ty::List(&U64, VALIDATOR_REGISTRY_LIMIT)),
            // EPOCHS_PER_HISTORICAL_VECTOR
            field("randao_mixes", Ty::Vector(&ROOT, 65536)),
            // EPOCHS_PER_SLASHINGS_VECTOR
            field("slashings", Ty::Vector(&U64, 8192)),
            $($later),*
        ])
    };
}

/// Altair's state after the slashings, then `$later`.
macro_rules! altair_state {
    ($($later:expr),*) => {
        beacon_state!(
            field("previous_epoch_participation", Ty::List(&U8, VALIDATOR_REGISTRY_LIMIT)),
            field("current_epoch_participation", Ty::List(&U8, VALIDATOR_REGISTRY_LIMIT)),
            JUSTIFICATION_BITS,
            PREVIOUS_JUSTIFIED,
            CURRENT_JUSTIFIED,
            FINALIZED,
            field("inactivity_scores", Ty::List(&U64, VALIDATOR_REGISTRY_LIMIT)),
            field("current_sync_committee", SYNC_COMMITTEE),
            field("next_sync_committee", SYNC_COMMITTEE)
            $(, $later)*
        )
    };
}

/// Capella's state after the slashings, with the fork's payload `$header`, then `$later`.
macro_rules! capella_state {
    ($header:expr $(, $later:expr)*) => {
        altair_state!(
            field("latest_execution_payload_header", $header),
            field("next_withdrawal_index", U64),
            field("next_withdrawal_validator_index", U64),
            field("historical_summaries", Ty::List(&HISTORICAL_SUMMARY, HISTORICAL_ROOTS_LIMIT))
            $(, $later)*
        )
    };
}

/// Electra's state, then `$later`.
macro_rules! electra_state {
    ($($later:expr),*) => {
        capella_state!(
            EXECUTION_PAYLOAD_HEADER,
            field("deposit_requests_start_index", U64),
            field("deposit_balance_to_consume", U64),
            field("exit_balance_to_consume", U64),
            field("earliest_exit_epoch", U64),
            field("consolidation_balance_to_consume", U64),
            field("earliest_consolidation_epoch", U64),
            // PENDING_DEPOSITS_LIMIT, PENDING_PARTIAL_WITHDRAWALS_LIMIT, PENDING_CONSOLIDATIONS_LIMIT
            field("pending_deposits", Ty::List(&PENDING_DEPOSIT, 1 << 27)),
            field("pending_partial_withdrawals", Ty::List(&PENDING_PARTIAL_WITHDRAWAL, 1 << 27)),
            field("pending_consolidations", Ty::List(&PENDING_CONSOLIDATION, 1 << 18))
            $(, $later)*
        )
    };
}

// MAX_ATTESTATIONS * SLOTS_PER_EPOCH
pub(super) const PHASE0_BEACON_STATE: Ty = beacon_state!(
    field("previous_epoch_attestations", Ty::List(&PENDING_ATTESTATION, 128 * 32)),
    field("current_epoch_attestations", Ty::List(&PENDING_ATTESTATION, 128 * 32)),
    JUSTIFICATION_BITS,
    PREVIOUS_JUSTIFIED,
    CURRENT_JUSTIFIED,
    FINALIZED
);
pub(super) const ALTAIR_BEACON_STATE: Ty = altair_state!();
pub(super) const BELLATRIX_BEACON_STATE: Ty =
    altair_state!(field("latest_execution_payload_header", BELLATRIX_EXECUTION_PAYLOAD_HEADER));
pub(super) const CAPELLA_BEACON_STATE: Ty = capella_state!(CAPELLA_EXECUTION_PAYLOAD_HEADER);
pub(super) const DENEB_BEACON_STATE: Ty = capella_state!(EXECUTION_PAYLOAD_HEADER);
pub(super) const ELECTRA_BEACON_STATE: Ty = electra_state!();
// (MIN_SEED_LOOKAHEAD + 1) * SLOTS_PER_EPOCH
pub(super) const FULU_BEACON_STATE: Ty = electra_state!(field("proposer_lookahead", Ty::Vector(&U64, 2 * 32)));

// the light client's objects (altair on; bellatrix's are altair's)

/// A light client's header of a fork with `$execution` (capella on), or of altair's (none).
macro_rules! light_client_header {
    () => {
        Ty::Container(&[field("beacon", BEACON_BLOCK_HEADER)])
    };
    ($execution:expr) => {
        Ty::Container(&[
            field("beacon", BEACON_BLOCK_HEADER),
            field("execution", $execution),
            // floorlog2(EXECUTION_PAYLOAD_GINDEX)
            field("execution_branch", Ty::Vector(&ROOT, 4)),
        ])
    };
}

pub(super) const ALTAIR_LIGHT_CLIENT_HEADER: Ty = light_client_header!();
pub(super) const CAPELLA_LIGHT_CLIENT_HEADER: Ty = light_client_header!(CAPELLA_EXECUTION_PAYLOAD_HEADER);
/// Deneb's, unchanged in electra and fulu.
pub(super) const DENEB_LIGHT_CLIENT_HEADER: Ty = light_client_header!(EXECUTION_PAYLOAD_HEADER);

const SIGNATURE_SLOT: Field = field("signature_slot", U64);

/// A light client's bootstrap, updates, finality and optimistic updates for `$header`, with the
/// depths of the branches to the current and next sync committees and to the finalized
/// checkpoint (electra's state has more fields: one level deeper).
macro_rules! light_client {
    ($header:expr, $sync_committee_depth:expr, $finality_depth:expr) => {
        [
            Ty::Container(&[
                field("header", $header),
                field("current_sync_committee", SYNC_COMMITTEE),
                field("current_sync_committee_branch", Ty::Vector(&ROOT, $sync_committee_depth)),
            ]),
            Ty::Container(&[
                field("attested_header", $header),
                field("next_sync_committee", SYNC_COMMITTEE),
                field("next_sync_committee_branch", Ty::Vector(&ROOT, $sync_committee_depth)),
                field("finalized_header", $header),
                field("finality_branch", Ty::Vector(&ROOT, $finality_depth)),
                SYNC_AGGREGATE_FIELD,
                SIGNATURE_SLOT,
            ]),
            Ty::Container(&[
                field("attested_header", $header),
                field("finalized_header", $header),
                field("finality_branch", Ty::Vector(&ROOT, $finality_depth)),
                SYNC_AGGREGATE_FIELD,
                SIGNATURE_SLOT,
            ]),
            Ty::Container(&[
                field("attested_header", $header),
                SYNC_AGGREGATE_FIELD,
                SIGNATURE_SLOT,
            ]),
        ]
    };
}

/// `LightClientBootstrap`, `LightClientUpdate`, `LightClientFinalityUpdate` and
/// `LightClientOptimisticUpdate`, in that order.
pub(super) type LightClient = [Ty; 4];

pub(super) static ALTAIR_LIGHT_CLIENT: LightClient = light_client!(ALTAIR_LIGHT_CLIENT_HEADER, 5, 6);
pub(super) static CAPELLA_LIGHT_CLIENT: LightClient = light_client!(CAPELLA_LIGHT_CLIENT_HEADER, 5, 6);
pub(super) static DENEB_LIGHT_CLIENT: LightClient = light_client!(DENEB_LIGHT_CLIENT_HEADER, 5, 6);
pub(super) static ELECTRA_LIGHT_CLIENT: LightClient = light_client!(DENEB_LIGHT_CLIENT_HEADER, 6, 7);
