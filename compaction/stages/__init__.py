"""Deciding and doing: ``decide`` (one decision per request), then
``execute`` — prune → condense → truncate — and the result a caller stores;
``compact`` runs them in one call."""
