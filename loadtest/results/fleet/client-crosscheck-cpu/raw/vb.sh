#!/bin/bash
# usage: vb.sh SEED RATE NAME
R=/tmp/xcheck-run/res
for p in 18100 18200; do curl -s -o /dev/null -w "reset $p %{http_code}\n" -X POST http://127.0.0.1:$p/reset_prefix_cache; done
python -c "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))" --backend openai --base-url http://127.0.0.1:18000 --model pdspec-tiny --tokenizer $HOME/.cache/pdspec/models/target --dataset-name prefix_repetition --prefix-repetition-prefix-len 256 --prefix-repetition-suffix-len 64 --prefix-repetition-num-prefixes 8 --prefix-repetition-output-len 16 --num-prompts 60 --request-rate $2 --seed $1 --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90 --save-result --save-detailed --result-dir $R --result-filename $3.json --disable-tqdm
