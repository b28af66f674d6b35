"""No code execution on any load path: checkpoints are Orbax (tensorstore + JSON), Hugging Face
weights safetensors read by our own parser, configs and results JSON. The library never imports
pickle or calls a loader that unpickles, and never evaluates strings."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "switchzoo"
FORBIDDEN_IMPORTS = {"pickle", "cPickle", "dill", "cloudpickle", "shelve", "marshal", "joblib"}
FORBIDDEN_CALLS = {"eval", "exec", "torch.load", "np.load", "numpy.load", "pd.read_pickle"}


def calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield ast.unparse(node.func)


def test_the_library_has_no_unpickling_or_eval():
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = {a.name.split(".")[0] for a in node.names}
                if isinstance(node, ast.ImportFrom) and node.module:
                    names.add(node.module.split(".")[0])
                assert not names & FORBIDDEN_IMPORTS, f"{path}: imports {names & FORBIDDEN_IMPORTS}"
        bad = set(calls(tree)) & FORBIDDEN_CALLS
        assert not bad, f"{path}: calls {bad}"
