//! Integration tests: one binary, so the AWS SDK links once.

mod backends;
mod batch;
mod batch_inputs;
mod broken_stores;
mod cached_store;
mod cancelled_steps;
mod claim_outlives_lease;
mod claims;
mod completion_writes;
mod cut_off_steps;
mod deadlines;
mod decorators;
mod durable_branches;
mod durable_functions;
mod durable_retention;
mod durable_retries;
mod dynamodb_store;
mod event_door;
mod eventbridge_senders;
mod exact_ids;
mod global_tables;
mod held_runs;
mod hostile_table;
mod hot_keys;
mod http_bodies;
mod http_contract;
mod http_identities;
mod http_inputs;
mod http_layer;
mod http_principals;
mod http_wire_format;
#[cfg(feature = "cli")]
mod idemctl;
mod identity_scopes;
mod keys;
mod kinesis_streams;
mod lambda_layer;
mod large_integers;
mod late_effects;
mod lease_bounded_effects;
mod lost_commits;
mod managed_instances;
mod memory_store;
#[cfg(feature = "emf")]
mod metrics;
#[cfg(all(feature = "sns", feature = "s3"))]
mod notification_doors;
mod operation_policies;
#[cfg(feature = "relay")]
mod outbox_chain;
#[cfg(feature = "relay")]
mod outbox_destinations;
mod outbox_ids;
#[cfg(feature = "relay")]
mod outbox_sweep_cut_short;
mod outbox_sweeper;
mod outbox_through_pipe;
mod outcome_storage;
mod owned_claims;
mod panic_strategy;
mod producers;
mod raw_fixtures;

mod operator_resolves_what_it_read;
mod operator_sees_steps;
mod readme_links;
mod recovery_cells;
mod refusals;
mod refused_commits;
#[cfg(feature = "relay")]
mod relay;
#[cfg(feature = "relay")]
mod relay_batches;
mod released_claims;
mod replayable_results;
mod schedules;
mod sdk_faults;
mod simulation;
mod simulation_defects;
mod sources;
mod spans;
mod step_costs;
mod step_limits;
mod store_primitives;
mod stored_formats;
#[cfg(feature = "relay")]
#[path = "../common/streams.rs"]
mod streams;
mod takeover_outages;
mod tenants;
mod terminal_on_streams;
mod transactions;
mod unkept_outcomes;
mod waiting;
#[cfg(feature = "relay")]
mod wrapped_deliveries;
