"""The agent (docs/design.md §3-§5): one module holding encoders, actor, critics and PopArt (`model`), its
losses as pure functions (`losses`), one gradient update (`learner`), and exploration while acting
(`exploration`)."""

from icrl.agent.learner import Learner
from icrl.agent.model import Agent, AgentPolicy

__all__ = ["Agent", "AgentPolicy", "Learner"]
