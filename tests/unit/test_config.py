import pytest

from opdflow.config import PipelineConfig
from opdflow.config.loader import load_pipeline
from opdflow.config.overrides import apply_overrides
from opdflow.errors import ConfigError


def test_defaults_validate_and_round_trip_through_a_dict():
    cfg = PipelineConfig().validate()
    again = PipelineConfig.from_dict(cfg.to_dict())
    assert again == cfg


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("staleness.k=-1", r"staleness\.k = -1 .*>= 0"),
        ("data.responses_per_prompt=0", r"data\.responses_per_prompt = 0 .*> 0"),
        ("train.lr=0", r"train\.lr = 0\.0 .*> 0"),
        ("train.lr=-1e-4", r"train\.lr"),
        ("train.loss=ppo", r"train\.loss = 'ppo'.*'opd'"),
        ("staleness.policy=adaptve", r"did you mean 'adaptive'"),
        ("engine.top_p=1.5", r"engine\.top_p = 1\.5"),
        ("train.steps=ten", r"train\.steps = 'ten'.*int"),
        ("models.tiny.hidden_size=64", r"head size >= 32"),
        ("resources.learner.workers=0", r"resources\.learner\.workers = 0 .*>= 1"),
        ("data.grader=maths", r"data\.grader = 'maths' .*did you mean 'math'"),
        ("data.grader_timeout_s=0", r"data\.grader_timeout_s = 0\.0 .*> 0"),
        ("engine.tensor_parallel_size=2", r"engine\.tensor_parallel_size = 2 .*engine\.kind"),
        ("engine.tensor_parallel_size=0", r"engine\.tensor_parallel_size = 0 .*\[1, 64\]"),
        ("engine.gpu_memory_utilization=1.5", r"engine\.gpu_memory_utilization = 1\.5"),
        ("eval.vllm_gpu_memory_utilization=0", r"eval\.vllm_gpu_memory_utilization = 0\.0"),
        ("models.tiny.student=blind", r"models\.tiny\.student = 'blind'.*'carry_blind'"),
        ("models.tiny.student=carry_blind", r"models\.tiny\.student .*data\.task\.worked=true"),
        ("models.tiny.carry_blind_share=0", r"models\.tiny\.carry_blind_share = 0"),
        ("weights.transport=nccl", r"weights\.transport = 'nccl'.*'collective'"),
        ("weights.timeout_s=0", r"weights\.timeout_s = 0"),
    ],
)
def test_bad_values_name_the_field_the_value_and_what_is_allowed(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(PipelineConfig(), [override])


def test_unknown_field_suggests_the_nearest_name():
    with pytest.raises(
        ConfigError, match=r"unknown config field 'train\.learning_rat'.*|did you mean"
    ):
        apply_overrides(PipelineConfig(), ["train.learning_rat=1"])
    with pytest.raises(ConfigError, match=r"did you mean 'steps'"):
        apply_overrides(PipelineConfig(), ["train.step=3"])
    with pytest.raises(ConfigError, match=r"unknown config field 'trian'.*did you mean 'train'"):
        apply_overrides(PipelineConfig(), ["trian.steps=3"])


def test_overrides_coerce_types():
    cfg = apply_overrides(
        PipelineConfig(),
        [
            "train.lr=3e-4",
            "staleness.k=4",
            "train.center_advantage=true",
            "run_dir=none",
            'resources.generator.resources={"rollout": 1}',
        ],
    )
    assert cfg.train.lr == 3e-4
    assert cfg.staleness.k == 4
    assert cfg.train.center_advantage is True
    assert cfg.run_dir is None
    assert cfg.resources.generator.resources == {"rollout": 1}


def test_from_dict_rejects_unknown_fields_and_wrong_types():
    with pytest.raises(
        ConfigError, match=r"unknown config field 'engine\.recipie'.*did you mean 'recipe'"
    ):
        PipelineConfig.from_dict({"engine": {"recipie": "fp8"}})
    with pytest.raises(ConfigError, match=r"engine\.replicas = '2'"):
        PipelineConfig.from_dict({"engine": {"replicas": "2"}})


def _write(tmp_path, text, name="p.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_pipeline_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_pipeline(str(tmp_path / "missing.py"))
    with pytest.raises(ConfigError, match="must be a Python file"):
        load_pipeline(_write(tmp_path, "x", "p.yaml"))
    with pytest.raises(ConfigError, match=r"has no function 'pipeline'.*its functions: other"):
        load_pipeline(_write(tmp_path, "def other():\n    pass\n"))
    with pytest.raises(ConfigError, match="raised ZeroDivisionError at import"):
        load_pipeline(_write(tmp_path, "1/0\n"))
    with pytest.raises(
        ConfigError, match=r"returned dict, expected opdflow\.config\.PipelineConfig"
    ):
        load_pipeline(_write(tmp_path, "def pipeline():\n    return {}\n"))
    with pytest.raises(ConfigError, match=r"pipeline\(\) raised KeyError"):
        load_pipeline(_write(tmp_path, "def pipeline():\n    return {}['x']\n"))


def test_pipeline_variant_and_overrides(tmp_path):
    path = _write(
        tmp_path,
        "from opdflow.config import PipelineConfig\n"
        "def pipeline():\n    return PipelineConfig(name='a')\n"
        "def fast():\n    c = pipeline()\n    c.train.steps = 3\n    return c\n",
    )
    assert load_pipeline(path).name == "a"
    assert load_pipeline(f"{path}:fast").train.steps == 3
    assert load_pipeline(f"{path}:fast", ["train.steps=5"]).train.steps == 5
    with pytest.raises(ConfigError, match=r"p\.py:pipeline: staleness\.k"):
        load_pipeline(path, ["staleness.k=-2"])


def test_same_config_ignores_fields_added_since_at_their_defaults(tmp_path):
    import json

    from opdflow.record.rundir import same_config

    cfg = PipelineConfig()
    old = cfg.to_dict()
    del old["resources"]["placement"]  # a run made before resources.placement existed
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert same_config(tmp_path, cfg)
    assert not same_config(tmp_path, apply_overrides(PipelineConfig(), ["train.lr=3e-4"]))
    assert not same_config(tmp_path / "missing", cfg)


def test_weights_transport_resolves_by_devices_and_refuses_nccl_to_a_cpu_consumer():
    from opdflow.weights.transport import Collective, ObjectStore
    from opdflow.weights.transport import for_pipeline as weights_transport

    gpus = [f"resources.{s}.num_gpus=1" for s in ("learner", "generator", "rescorer", "evaluator")]
    assert weights_transport(PipelineConfig()) == ObjectStore()  # auto on CPUs
    on_gpus = weights_transport(apply_overrides(PipelineConfig(), [*gpus, "weights.bucket_mb=64"]))
    assert on_gpus == Collective(bucket_bytes=64 * 2**20, timeout_s=300.0)
    assert weights_transport(apply_overrides(PipelineConfig(), gpus[:3])) == ObjectStore()
    cpu_collective = apply_overrides(PipelineConfig(), ["weights.transport=collective"])
    assert weights_transport(cpu_collective).name == "collective"  # gloo
    with pytest.raises(ConfigError, match=r"weights\.transport = 'collective'.*evaluator"):
        apply_overrides(PipelineConfig(), [*gpus[:3], "weights.transport=collective"])
