// One function of functions/ as template.yaml deploys it: built by cargo-lambda-cdk's
// RustFunction (`cargo lambda build --release --arm64 --bin <binary>`, as SAM builds it), arm64,
// the tables' names in its environment, JSON logs in a log group of its own kept 30 days, and
// DescribeTable on the tables its store reads (for `prime`).
import { CfnResource, Duration, RemovalPolicy } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as logs from 'aws-cdk-lib/aws-logs';
import { RustFunction } from 'cargo-lambda-cdk';
import { Construct } from 'constructs';
import * as path from 'path';

import { allow } from './policies';

const FUNCTIONS_CRATE = path.join(__dirname, '..', '..', '..', 'functions', 'Cargo.toml');

/** The tables every function is told about. */
export interface ExampleTables {
  readonly idempotency: dynamodb.Table;
  readonly ledger: dynamodb.Table;
}

/** What a function sets beyond the stack's defaults. */
export interface ExampleFunctionProps {
  readonly binary: string;
  readonly description: string;
  readonly environment?: Record<string, string>;
  readonly timeout?: Duration;
  readonly memorySize?: number;
  /** Retries of a failed asynchronous invocation (a schedule's run): Lambda's default when unset. */
  readonly retryAttempts?: number;
  /** The tables `prime` describes at init: the idempotency table when unset; none for the
   * outbox's functions, which keep no idempotency records. */
  readonly describes?: dynamodb.ITable[];
}

export function exampleFunction(
  scope: Construct,
  id: string,
  tables: ExampleTables,
  props: ExampleFunctionProps,
): RustFunction {
  // Deleted with the stack, as template.yaml's log groups are.
  const logGroup = new logs.LogGroup(scope, `${id}LogGroup`, {
    retention: logs.RetentionDays.ONE_MONTH,
    removalPolicy: RemovalPolicy.DESTROY,
  });
  const fn = new RustFunction(scope, id, {
    manifestPath: FUNCTIONS_CRATE,
    binaryName: props.binary,
    architecture: lambda.Architecture.ARM_64,
    memorySize: props.memorySize ?? 256,
    timeout: props.timeout ?? Duration.seconds(30),
    retryAttempts: props.retryAttempts,
    description: props.description,
    environment: {
      IDEMPOTENCY_TABLE: tables.idempotency.tableName,
      LEDGER_TABLE: tables.ledger.tableName,
      ...props.environment,
    },
    logGroup,
    loggingFormat: lambda.LoggingFormat.JSON,
    applicationLogLevelV2: lambda.ApplicationLogLevel.INFO,
    systemLogLevelV2: lambda.SystemLogLevel.WARN,
  });
  // Which binary the function runs, where SAM keeps it: the IAM check maps recordings by it.
  (fn.node.defaultChild as CfnResource).addMetadata('BuildProperties', { Binary: props.binary });
  const describes = props.describes ?? [tables.idempotency];
  if (describes.length) {
    fn.addToRolePolicy(allow(['dynamodb:DescribeTable'], describes.map((table) => table.tableArn)));
  }
  return fn;
}
