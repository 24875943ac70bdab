// graphile-worker's side of a `go run ./bench -run peers` line, driven by
// bench/graphile.go over stdin and stdout, one command and one answer a line:
//
//   fill N           adds N jobs with addJobs          -> "filled"
//   segment TOTAL MS runs a runner until MS ms passed   -> "done JOBS ELAPSED_NS START_NS STOP_NS"
//                    or TOTAL jobs were handled
//   (end of stdin)   closes the pool and exits
//
// Settings come from the environment: GRAPHILE_DSN, GRAPHILE_WORKERS (the
// runner's concurrentJobs) and GRAPHILE_PAYLOAD (the job payload's string).
// The schema (graphile_worker) is made afresh by the Go side's DROP and the
// migrate here. Anything else goes to stderr, which the Go side logs.
"use strict";

const readline = require("node:readline");
const { Pool } = require("pg");
const { run, makeWorkerUtils, Logger } = require("graphile-worker");

const dsn = process.env.GRAPHILE_DSN;
const workers = Number(process.env.GRAPHILE_WORKERS);
const body = process.env.GRAPHILE_PAYLOAD;
if (!dsn || !(workers > 0) || !body) {
  console.error("run.js: GRAPHILE_DSN, GRAPHILE_WORKERS and GRAPHILE_PAYLOAD are required");
  process.exit(2);
}

// Warnings and errors only, as River's logger on the Go side: the default
// logger prints a line per completed job.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") {
    console.error(`graphile-worker ${level}: ${message}`);
  }
});

// The fastest setup of graphile-worker's performance page
// (worker.graphile.org/docs/performance): a local queue of 500 jobs fetched
// (and locked) at once, and completions and failures batched. pollInterval
// only matters once the queue is empty.
const preset = {
  worker: {
    concurrentJobs: workers,
    pollInterval: 10,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
};

// One pool for the line, so that a segment's runner does not connect anew:
// a connection per worker and four for the runner's own (its LISTEN, the
// local queue's fetches, the batched completions), as River's pool.
const pgPool = new Pool({ connectionString: dsn, max: workers + 4 });
// Errors of idle connections, and of connections between queries, are
// logged rather than crashing the process (graphile-worker asks for both).
pgPool.on("error", (e) => console.error(`graphile-worker pool: ${e.message}`));
pgPool.on("connect", (client) => {
  client.on("error", (e) => console.error(`graphile-worker client: ${e.message}`));
});

let handled = 0;
let goal = Infinity; // handled count at which the segment's jobs are all done
let reached = null; // resolves the segment's wait when goal is reached

// The no-op task: it checks the payload and counts the job.
const taskList = {
  bench_noop: async (payload) => {
    if (!payload || payload.p !== body) {
      throw new Error(`payload of ${JSON.stringify(payload).length} bytes, not the bench's`);
    }
    handled++;
    if (handled === goal && reached) reached();
  },
};

let utils;

async function fill(n) {
  const spec = { identifier: "bench_noop", payload: { p: body } };
  while (n > 0) {
    const k = Math.min(n, 2000);
    await utils.addJobs(Array.from({ length: k }, () => spec));
    n -= k;
  }
  return "filled";
}

// segment starts a runner on the jobs already queued and stops it when ms
// have passed or total jobs were handled. The runner's stop resolves once
// its running jobs are done, their completions written and the local
// queue's unstarted jobs returned to the table: every job counted is
// deleted by then, within the elapsed time, and no other job is.
async function segment(total, ms) {
  const before = handled;
  goal = before + total;
  const done = new Promise((resolve) => {
    reached = resolve;
    setTimeout(resolve, ms);
  });
  const t0 = process.hrtime.bigint();
  const runner = await run({ pgPool, taskList, preset, logger, noHandleSignals: true });
  const t1 = process.hrtime.bigint();
  await done;
  const t2 = process.hrtime.bigint();
  await runner.stop();
  await runner.promise;
  const t3 = process.hrtime.bigint();
  goal = Infinity;
  reached = null;
  return `done ${handled - before} ${t3 - t0} ${t1 - t0} ${t3 - t2}`;
}

async function main() {
  utils = await makeWorkerUtils({ pgPool, logger });
  await utils.migrate();
  console.log("ready");
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    const [cmd, a, b] = line.trim().split(/\s+/);
    let answer;
    if (cmd === "fill") {
      answer = await fill(Number(a));
    } else if (cmd === "segment") {
      answer = await segment(Number(a), Number(b));
    } else {
      throw new Error(`unknown command ${JSON.stringify(line)}`);
    }
    console.log(answer);
  }
  await utils.release();
  await pgPool.end();
}

main().catch((e) => {
  console.error(`run.js: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
