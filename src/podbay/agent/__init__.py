"""podbay.agent"""
