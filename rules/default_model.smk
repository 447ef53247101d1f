# The embedded default: when no course files are given, the workflow builds its own
# small Korean corpus, a byte-level BPE tokenizer and two MiniMind checkpoints
# (pretrained, then SFT). Every config knob a rule reads is one of its params, so
# changing a knob reruns exactly the jobs that read it (and what depends on them).
#
# All four jobs run single-threaded: on a small CPU the tiny model trains no faster
# on two threads, and a fixed thread count keeps the weights the same whatever --cores.

DEFAULT_MODEL = config["default_model"]
# Its files are the inputs the lab reads when the config names none (kvlab.config.DEFAULT_INPUTS).
DEFAULT_DIR = Path(lab_config.DEFAULT_INPUTS["pretrain"]).parent
DEFAULT_CORPUS = Path(lab_config.DEFAULT_INPUTS["val_data"]).parent
DEFAULT_TOKENIZER = lab_config.DEFAULT_INPUTS["tokenizer"]


rule corpus:
    output:
        train=f"{DEFAULT_CORPUS}/pretrain_train.jsonl",
        val=lab_config.DEFAULT_INPUTS["val_data"],
        sft=f"{DEFAULT_CORPUS}/sft.jsonl",
    log:
        "results/logs/corpus.log",
    benchmark:
        "results/benchmarks/corpus.tsv"
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        seed=DEFAULT_MODEL["seed"],
        train_docs=DEFAULT_MODEL["corpus"]["train_docs"],
        val_docs=DEFAULT_MODEL["corpus"]["val_docs"],
        sft_examples=DEFAULT_MODEL["corpus"]["sft_examples"],
    script:
        "../scripts/build_corpus.py"


rule tokenizer:
    input:
        train=rules.corpus.output.train,
        sft=rules.corpus.output.sft,
    output:
        **lab_config.tokenizer_files(DEFAULT_TOKENIZER, given=False),
    log:
        "results/logs/tokenizer.log",
    benchmark:
        "results/benchmarks/tokenizer.tsv"
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        vocab_size=DEFAULT_MODEL["tokenizer"]["vocab_size"],
    script:
        "../scripts/train_tokenizer.py"


rule pretrain:
    input:
        tokenizer=rules.tokenizer.output.tokenizer,
        tokenizer_config=rules.tokenizer.output.tokenizer_config,
        train=rules.corpus.output.train,
        val=rules.corpus.output.val,
    output:
        model=lab_config.DEFAULT_INPUTS["pretrain"],
        metrics=f"{DEFAULT_DIR}/pretrain_metrics.json",
    log:
        "results/logs/pretrain.log",
    benchmark:
        "results/benchmarks/pretrain.tsv"
    threads: 1
    resources:
        **TRAINING_JOB,
    params:
        seed=DEFAULT_MODEL["seed"],
        model=DEFAULT_MODEL["model"],
        steps=DEFAULT_MODEL["pretrain"]["steps"],
        batch_size=DEFAULT_MODEL["pretrain"]["batch_size"],
        seq_len=DEFAULT_MODEL["pretrain"]["seq_len"],
        lr=DEFAULT_MODEL["pretrain"]["lr"],
    script:
        "../scripts/pretrain.py"


rule sft:
    input:
        pretrain=rules.pretrain.output.model,
        tokenizer=rules.tokenizer.output.tokenizer,
        tokenizer_config=rules.tokenizer.output.tokenizer_config,
        sft=rules.corpus.output.sft,
    output:
        model=lab_config.DEFAULT_INPUTS["sft"],
        metrics=f"{DEFAULT_DIR}/sft_metrics.json",
    log:
        "results/logs/sft.log",
    benchmark:
        "results/benchmarks/sft.tsv"
    threads: 1
    resources:
        **TRAINING_JOB,
    params:
        seed=DEFAULT_MODEL["seed"],
        steps=DEFAULT_MODEL["sft"]["steps"],
        batch_size=DEFAULT_MODEL["sft"]["batch_size"],
        seq_len=DEFAULT_MODEL["sft"]["seq_len"],
        lr=DEFAULT_MODEL["sft"]["lr"],
    script:
        "../scripts/sft.py"
