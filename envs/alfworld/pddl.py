"""PDDL problems of the ALFRED domain: parsing, writing and goal evaluation.

Official ALFWorld problems (``initial_state.pddl`` and the ``pddl_problem`` field of a
``game.tw-pddl`` file) are plain PDDL with typed objects, ground ``:init`` atoms and a goal made
of ``and`` / ``or`` / ``not`` / ``exists`` / ``forall`` / ``=``. Names are case-insensitive in
PDDL and the official engine (Fast Downward) lower-cases them, so everything is lower-cased
here too: entity ids, predicates and types.

Goals are compiled once per problem into a conjunctive query over the state's facts that is
solved by backtracking over indexed facts, so checking ``won`` costs microseconds.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

Atom = tuple  # (predicate, arg1, arg2, ...), all lower-case strings


class GameFileError(ValueError):
    """A game or problem file that cannot be read; the message names the file and the problem."""


# --------------------------------------------------------------------------------------------
# S-expressions
# --------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def parse_sexpr(text: str, *, where: str = "pddl") -> list:
    """Parse one PDDL s-expression (comments starting with ';' are dropped)."""
    lines = [line.split(";", 1)[0] for line in text.splitlines()]
    tokens = _TOKEN.findall("\n".join(lines))
    if not tokens:
        raise GameFileError(f"{where}: empty PDDL text")
    stack: list[list] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                raise GameFileError(f"{where}: unbalanced ')' in PDDL text")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok.lower())
    if len(stack) != 1:
        raise GameFileError(f"{where}: {len(stack) - 1} unclosed '(' in PDDL text")
    if len(stack[0]) != 1 or not isinstance(stack[0][0], list):
        raise GameFileError(f"{where}: expected exactly one top-level (define ...) form")
    return stack[0][0]


def _typed_list(items: Sequence, where: str) -> list[tuple[str, str]]:
    """``a b - t1 c - t2`` -> [(a, t1), (b, t1), (c, t2)]; untyped names get type 'object'."""
    out: list[tuple[str, str]] = []
    pending: list[str] = []
    i = 0
    while i < len(items):
        tok = items[i]
        if not isinstance(tok, str):
            raise GameFileError(f"{where}: unexpected list {tok!r} in a typed list")
        if tok == "-":
            if i + 1 >= len(items) or not isinstance(items[i + 1], str):
                raise GameFileError(f"{where}: '-' without a type in a typed list")
            out.extend((name, items[i + 1]) for name in pending)
            pending = []
            i += 2
            continue
        pending.append(tok)
        i += 1
    out.extend((name, "object") for name in pending)
    return out


# --------------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Problem:
    """A parsed PDDL problem: typed objects, ground initial atoms and the goal expression.

    ``goal`` is a nested tuple: ``("and", e, ...)``, ``("or", ...)``, ``("not", e)``,
    ``("exists", ((var, type), ...), e)``, ``("forall", ..., e)``, ``("=", a, b)`` or an atom
    ``(pred, arg, ...)``; variables start with '?'.
    """

    name: str
    domain: str
    objects: tuple[tuple[str, str], ...]
    init: tuple[Atom, ...]
    goal: Any
    metric: tuple = ()

    def object_types(self) -> dict[str, str]:
        """{object: its PDDL type} of the problem."""
        return dict(self.objects)


def _to_expr(node: Any, where: str) -> Any:
    if isinstance(node, str):
        return node
    if not node:
        return ("and",)
    head = node[0]
    if not isinstance(head, str):
        raise GameFileError(f"{where}: goal expression starts with a list: {node!r}")
    if head in ("and", "or"):
        return (head, *(_to_expr(n, where) for n in node[1:]))
    if head == "not":
        if len(node) != 2:
            raise GameFileError(f"{where}: (not ...) takes one argument")
        return ("not", _to_expr(node[1], where))
    if head == "imply":
        return ("or", ("not", _to_expr(node[1], where)), _to_expr(node[2], where))
    if head in ("exists", "forall"):
        if len(node) != 3 or not isinstance(node[1], list):
            raise GameFileError(f"{where}: malformed ({head} ...)")
        params = tuple(_typed_list(node[1], where))
        return (head, params, _to_expr(node[2], where))
    if any(not isinstance(a, str) for a in node[1:]):
        raise GameFileError(f"{where}: nested term in atom {node!r}")
    return tuple(node)


def parse_problem(text: str, *, where: str = "problem") -> Problem:
    """Parse a PDDL problem text; errors raise ``GameFileError`` naming ``where``."""
    tree = parse_sexpr(text, where=where)
    if not tree or tree[0] != "define":
        raise GameFileError(f"{where}: PDDL problem must start with (define ...)")
    name = domain = None
    objects: list[tuple[str, str]] = []
    init: list[Atom] = []
    metric: tuple = ()
    goal: Any = None
    for part in tree[1:]:
        if not isinstance(part, list) or not part:
            raise GameFileError(f"{where}: unexpected token {part!r} in (define ...)")
        key = part[0]
        if key == "problem":
            name = part[1] if len(part) > 1 else ""
        elif key == ":domain":
            domain = part[1] if len(part) > 1 else ""
        elif key == ":objects":
            objects = _typed_list(part[1:], where)
        elif key == ":init":
            for atom in part[1:]:
                if not isinstance(atom, list) or not atom:
                    raise GameFileError(f"{where}: malformed :init entry {atom!r}")
                if atom[0] == "=":  # numeric fluents (total cost, distances): unused by the game
                    continue
                if atom[0] == "not":
                    continue  # closed-world assumption: negative init atoms add nothing
                if any(not isinstance(a, str) for a in atom):
                    raise GameFileError(f"{where}: nested term in :init atom {atom!r}")
                init.append(tuple(atom))
        elif key == ":goal":
            if len(part) != 2:
                raise GameFileError(f"{where}: (:goal ...) takes exactly one expression")
            goal = _to_expr(part[1], where)
        elif key == ":metric":
            metric = tuple(str(p) for p in part[1:])
        elif key == ":requirements":
            pass
        else:
            raise GameFileError(f"{where}: unknown problem section {key!r}")
    if domain is None:
        raise GameFileError(f"{where}: missing (:domain ...)")
    if goal is None:
        raise GameFileError(f"{where}: missing (:goal ...)")
    declared = {n for n, _ in objects}
    for atom in init:
        for arg in atom[1:]:
            if arg not in declared:
                raise GameFileError(
                    f"{where}: :init atom ({' '.join(atom)}) uses undeclared object {arg!r}")
    return Problem(name=name or "", domain=domain, objects=tuple(objects), init=tuple(init),
                   goal=goal, metric=metric)


def _expr_text(e: Any, indent: int, case: Mapping[str, str]) -> str:
    pad = " " * indent
    if isinstance(e, str):
        return pad + case.get(e, e)
    head = e[0]
    if head in ("and", "or"):
        inner = "\n".join(_expr_text(x, indent + 4, case) for x in e[1:])
        return f"{pad}({head}\n{inner}\n{pad})"
    if head == "not":
        return f"{pad}(not {_expr_text(e[1], 0, case)})"
    if head in ("exists", "forall"):
        params = " ".join(f"{v} - {t}" for v, t in e[1])
        return f"{pad}({head} ({params})\n{_expr_text(e[2], indent + 4, case)}\n{pad})"
    return pad + "(" + " ".join(case.get(x, x) for x in e) + ")"


def write_problem(problem: Problem, *, objects_case: Mapping[str, str] | None = None) -> str:
    """PDDL text of ``problem`` in the official layout (``name - type`` objects, one atom a line).

    ``objects_case`` optionally maps lower-case names (ids, predicates) back to the spelling to
    write (the official files keep ALFRED's capitalisation; reading lower-cases either way).
    """
    case = objects_case or {}
    lines = [f"(define (problem {problem.name})", f"    (:domain {problem.domain})"]
    if problem.metric:
        lines.append("    (:metric " + " ".join(problem.metric) + ")")
    lines.append("    (:objects")
    for name, typ in problem.objects:
        lines.append(f"        {case.get(name, name)} - {typ}")
    lines.append("    )")
    lines.append("    (:init")
    for atom in problem.init:
        lines.append("        (" + " ".join(case.get(a, a) for a in atom) + ")")
    lines.append("    )")
    lines.append("    (:goal")
    lines.append(_expr_text(problem.goal, 8, case))
    lines.append("    )")
    lines.append(")")
    return "\n".join(lines) + "\n"


def predicate_spellings(domain_text: str) -> dict[str, str]:
    """lower-case predicate name -> its spelling in a domain's (:predicates ...) section."""
    m = re.search(r"\(:predicates(.*?)\n\s*\)\s*\n", domain_text, re.DOTALL | re.IGNORECASE)
    body = m.group(1) if m else domain_text
    return {name.lower(): name for name in re.findall(r"\(\s*([A-Za-z][\w-]*)\s+\?", body)}


# --------------------------------------------------------------------------------------------
# Goal evaluation
# --------------------------------------------------------------------------------------------
FactSource = Callable[[str], Iterable[tuple]]  # predicate -> argument tuples true now


def _free_vars(e: Any, bound: frozenset = frozenset()) -> set[str]:
    if isinstance(e, str):
        return {e} if e.startswith("?") and e not in bound else set()
    head = e[0]
    if head in ("and", "or"):
        out: set[str] = set()
        for x in e[1:]:
            out |= _free_vars(x, bound)
        return out
    if head == "not":
        return _free_vars(e[1], bound)
    if head in ("exists", "forall"):
        return _free_vars(e[2], bound | {v for v, _ in e[1]})
    return {a for a in e[1:] if a.startswith("?") and a not in bound}


class GoalChecker:
    """Decides a goal expression against a fact source (compiled once per problem).

    ``exists`` nested inside ``and`` is flattened into one conjunctive query; its positive atoms
    bind variables from the indexed facts (smallest candidate set first), negations and
    equalities are tested once their variables are bound. ``or`` / ``forall`` fall back to
    enumeration over the typed domain.
    """

    def __init__(self, goal: Any, objects_by_type: Mapping[str, Sequence[str]],
                 static_facts: Mapping[str, frozenset] | None = None):
        self.goal = goal
        self.objects_by_type = objects_by_type
        self._counter = 0
        self._compiled = None
        self._static = dict(static_facts or {})
        if not isinstance(goal, str) and goal[0] in ("and", "exists"):
            vars_: list = []
            lits: list = []
            self._flatten(goal, {}, vars_, lits)
            types = dict(vars_)
            lits, domains = self._prefilter(lits, types)
            self._compiled = (lits, types, domains)

    def _prefilter(self, lits: list, types: dict) -> tuple[list, dict]:
        """Fold static literals over a single variable (e.g. ``(objectType ?o MugType)``) into
        precomputed candidate sets for that variable; they never change during a game."""
        domains: dict[str, set] = {}
        rest = []
        for lit in lits:
            kind = lit[0]
            if kind in self._static and not kind.startswith("__"):
                vars_in = {a for a in lit[1:] if a in types}
                if len(vars_in) == 1:
                    (v,) = vars_in
                    pos = [i for i, a in enumerate(lit[1:]) if a == v]
                    ok = set()
                    for t in self._static[kind]:
                        if len(t) != len(lit) - 1:
                            continue
                        if all(t[i] == a for i, a in enumerate(lit[1:]) if a != v) and \
                                len({t[i] for i in pos}) == 1:
                            ok.add(t[pos[0]])
                    domains[v] = ok if v not in domains else domains[v] & ok
                    continue
            rest.append(lit)
        return rest, {v: frozenset(d) for v, d in domains.items()}

    def __call__(self, facts: FactSource) -> bool:
        if self._compiled is not None:
            lits, types, domains = self._compiled
            return self._solve(lits, {}, facts, set(types), types, domains)
        return self._eval(self.goal, {}, facts)

    # Flatten an expression into (new variables with types, literals) when it is a pure
    # conjunction of atoms / negations / equalities / existentials.
    def _flatten(self, e: Any, renames: dict[str, str], vars_out: list, lits_out: list) -> bool:
        if isinstance(e, str):
            return False
        head = e[0]
        if head == "and":
            return all(self._flatten(x, renames, vars_out, lits_out) for x in e[1:])
        if head == "exists":
            inner = dict(renames)
            for v, t in e[1]:
                self._counter += 1
                fresh = f"{v}#{self._counter}"
                inner[v] = fresh
                vars_out.append((fresh, t))
            return self._flatten(e[2], inner, vars_out, lits_out)
        if head in ("or", "forall"):
            lits_out.append(("__sub__", e, dict(renames)))
            return True
        if head == "not":
            lits_out.append(("__not__", self._rename(e[1], renames)))
            return True
        lits_out.append(self._rename(e, renames))
        return True

    def _rename(self, e: Any, renames: Mapping[str, str]) -> Any:
        if isinstance(e, str):
            return renames.get(e, e)
        head = e[0]
        if head in ("and", "or"):
            return (head, *(self._rename(x, renames) for x in e[1:]))
        if head == "not":
            return ("not", self._rename(e[1], renames))
        if head in ("exists", "forall"):
            inner = {k: v for k, v in renames.items() if k not in {v_ for v_, _ in e[1]}}
            return (head, e[1], self._rename(e[2], inner))
        return (e[0], *(renames.get(a, a) for a in e[1:]))

    def _eval(self, e: Any, env: dict[str, str], facts: FactSource) -> bool:
        head = e[0]
        if head in ("and", "exists"):
            vars_: list = []
            lits: list = []
            self._flatten(e, {}, vars_, lits)
            return self._solve(lits, dict(env), facts, {v for v, _ in vars_}, dict(vars_), {})
        if head == "or":
            return any(self._eval(x, env, facts) for x in e[1:])
        if head == "not":
            return not self._eval(e[1], env, facts)
        if head == "forall":
            names = [v for v, _ in e[1]]
            return all(
                self._eval(e[2], {**env, **dict(zip(names, combo))}, facts)
                for combo in self._domain_product([t for _, t in e[1]]))
        if head == "=":
            return env.get(e[1], e[1]) == env.get(e[2], e[2])
        args = tuple(env.get(a, a) for a in e[1:])
        return args in self._fact_set(head, facts)

    def _domain_product(self, types: Sequence[str]):
        import itertools

        return itertools.product(*(self.objects_by_type.get(t, ()) for t in types))

    @staticmethod
    def _fact_set(pred: str, facts: FactSource) -> set:
        got = facts(pred)
        return got if isinstance(got, (set, frozenset)) else set(got)

    def _solve(self, lits: list, env: dict, facts: FactSource, unbound: set, types: dict,
               domains: Mapping[str, frozenset]) -> bool:
        if not lits:
            if unbound:  # variables no literal constrains: any allowed object will do
                return all(domains.get(v, self.objects_by_type.get(types[v])) for v in unbound)
            return True
        # Branch on a variable with a tiny static domain before scanning facts.
        small = [v for v in unbound if v in domains and len(domains[v]) <= 3]
        if small:
            var = min(small, key=lambda v: len(domains[v]))
            for value in sorted(domains[var]):
                if self._solve(lits, {**env, var: value}, facts, unbound - {var}, types, domains):
                    return True
            return False
        # Pick a literal: a fully bound test first, else the positive atom with fewest matches.
        best = None
        best_cands = None
        for i, lit in enumerate(lits):
            kind = lit[0]
            if kind == "__sub__":
                _, sub, renames = lit
                free = {renames.get(v, v) for v in _free_vars(sub)}
                if not (free & unbound):
                    best = i
                    best_cands = None
                    break
                continue
            if kind == "__not__":
                inner = lit[1]
                if not (_free_vars(inner) & unbound):
                    best, best_cands = i, None
                    break
                continue
            if kind == "=":
                if lit[1] not in unbound and lit[2] not in unbound:
                    best, best_cands = i, None
                    break
                continue
            args = lit[1:]
            if not any(a in unbound for a in args):
                best, best_cands = i, None
                break
            cands = [t for t in self._fact_set(kind, facts) if len(t) == len(args) and all(
                (env.get(a, a) == v) if a not in unbound else (a not in domains or v in domains[a])
                for a, v in zip(args, t))]
            if best_cands is None or len(cands) < len(best_cands):
                best, best_cands = i, cands
        if best is None:
            # Only sub-formulas / negations with unbound vars remain: enumerate one variable.
            var = next(iter(sorted(unbound)))
            for value in domains.get(var, self.objects_by_type.get(types[var], ())):
                if self._solve(lits, {**env, var: value}, facts, unbound - {var}, types, domains):
                    return True
            return False
        lit = lits[best]
        rest = lits[:best] + lits[best + 1:]
        if best_cands is None:
            if lit[0] == "__sub__":
                _, sub, renames = lit
                sub_env = {k: env[v] for k, v in renames.items() if v in env}
                sub_env.update({k: v for k, v in env.items() if not k.startswith("?")})
                ok = self._eval(sub, {**env, **sub_env}, facts)
            elif lit[0] == "__not__":
                ok = not self._eval(lit[1], env, facts)
            elif lit[0] == "=":
                ok = env.get(lit[1], lit[1]) == env.get(lit[2], lit[2])
            else:
                ok = tuple(env.get(a, a) for a in lit[1:]) in self._fact_set(lit[0], facts)
            return ok and self._solve(rest, env, facts, unbound, types, domains)
        args = lit[1:]
        for values in best_cands:
            new_env = dict(env)
            newly = set()
            consistent = True
            for a, v in zip(args, values):
                if a in unbound and a not in newly:
                    new_env[a] = v
                    newly.add(a)
                elif new_env.get(a, a) != v:
                    consistent = False
                    break
            if consistent and self._solve(rest, new_env, facts, unbound - newly, types, domains):
                return True
        return False
