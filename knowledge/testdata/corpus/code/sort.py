import random


def quicksort(items):
    """Sort items by choosing a pivot and partitioning around it."""
    if len(items) <= 1:
        return items
    pivot = random.choice(items)
    less = [x for x in items if x < pivot]
    more = [x for x in items if x > pivot]
    return quicksort(less) + [x for x in items if x == pivot] + quicksort(more)


def bubble(items):
    """Repeatedly swap adjacent elements that are out of order."""
    n = len(items)
    for i in range(n):
        for j in range(n - i - 1):
            if items[j] > items[j + 1]:
                items[j], items[j + 1] = items[j + 1], items[j]
    return items
