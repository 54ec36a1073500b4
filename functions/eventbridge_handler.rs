//! The deployable binary of `examples/eventbridge_handler.rs`, for SAM (`BuildMethod: rust-cargolambda`,
//! `Binary: eventbridge_handler`); built with `--features lambda-examples`.

#[path = "../examples/eventbridge_handler.rs"]
mod function;

fn main() -> Result<(), lambda_runtime::Error> {
    function::main()
}
