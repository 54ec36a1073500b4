//! The deployable binary of `examples/api_payments.rs`, for SAM (`BuildMethod: rust-cargolambda`,
//! `Binary: api_payments`); built with `--features lambda-examples`.

#[path = "../examples/api_payments.rs"]
mod function;

fn main() -> Result<(), lambda_runtime::Error> {
    function::main()
}
