//! The deployable binary of `examples/sqs_orders.rs`, for SAM (`BuildMethod: rust-cargolambda`,
//! `Binary: sqs_orders`); built with `--features lambda-examples`.

#[path = "../examples/sqs_orders.rs"]
mod function;

fn main() -> Result<(), lambda_runtime::Error> {
    function::main()
}
